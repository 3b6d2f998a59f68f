#include "actors/evaluator_core.hpp"

#include <algorithm>
#include <cstring>

#include "net/checkpoint.hpp"
#include "net/tensor_codec.hpp"

namespace troupe::actors {

evaluator_core::evaluator_core(config c, model::model net) : c_(std::move(c)), net_(std::move(net)) {
  flat_ = net_.flatten();
}

std::vector<outgoing> evaluator_core::begin(const snapshot_request& r) {
  if (active_) throw error("a snapshot is already in progress (epoch " + std::to_string(req_.epoch) + ")");
  req_ = r;
  active_ = true;
  rule_state_.clear();
  versions_.assign(c_.shards.size(), 0);
  answered_.assign(c_.shards.size(), false);
  pending_ = static_cast<int>(c_.shards.size());
  if (c_.hogwild) {
    c_.hogwild->read(flat_.values.data());
    return {};
  }
  std::vector<outgoing> out;
  for (const auto& s : c_.shards) out.push_back({s.address, make_pull(c_.self, s.address, r.checkpoint, r.steps)});
  return out;
}

bool evaluator_core::on_params(const net::message& m) { return on_params(net::envelope_reader(m, net::peer_limits())); }

bool evaluator_core::on_params(const net::envelope_reader& r) {
  if (r.root().which() != wire::Envelope::PARAMS)
    throw net::message_error(net::reject_reason::unknown_kind, "expected Params");
  auto p = r.root().getParams();
  const uint32_t s = p.getShard();
  if (s >= c_.shards.size())
    throw net::message_error(net::reject_reason::malformed, "Params of shard " + std::to_string(s) +
                                                                ", which does not exist");
  // A pull asked again (retry()) may be answered twice; the first answer counts.
  if (!active_ || answered_[s]) return false;
  const model::shard_range& range = c_.shards[s].range;
  const net::flat_view v = net::view(p.getValues(), "params");
  net::require_range(v, range.first, range.begin, net_.layout().shapes(range.first, range.last),
                     "params of shard " + std::to_string(s));
  std::memcpy(flat_.values.data() + range.begin, v.data, range.numel() * sizeof(float));
  versions_[s] = p.getVersion();
  for (auto& t : net::decode(p.getRuleState(), "shard state"))
    rule_state_.push_back({"shard" + std::to_string(s) + "/" + t.name, std::move(t.value)});
  answered_[s] = true;
  --pending_;
  return true;
}

std::vector<outgoing> evaluator_core::retry() const {
  std::vector<outgoing> out;
  for (std::size_t s = 0; s < answered_.size(); ++s)
    if (active_ && !answered_[s])
      out.push_back({c_.shards[s].address, make_pull(c_.self, c_.shards[s].address, req_.checkpoint, req_.steps)});
  return out;
}

std::string evaluator_core::missing() const {
  std::string out;
  for (std::size_t s = 0; s < answered_.size(); ++s)
    if (!answered_[s]) out += (out.empty() ? "" : ", ") + net::to_string(c_.shards[s].address);
  return out;
}

evaluation_result evaluator_core::finish() {
  if (!complete()) throw error("the snapshot is not complete (waiting for " + missing() + ")");
  active_ = false;
  evaluation_result e;
  e.epoch = req_.epoch;
  e.periodic = req_.periodic;
  // Batch norm's statistics stay with the workers' replicas: estimated here for the snapshot.
  train::estimate_batch_norm(net_, ctx_, c_.data->sets.train, c_.data->norm, c_.batch_size, batch_norm_batches,
                             req_.epoch);
  if (req_.evaluate) {
    const train::accuracies a = train::score_sets(net_, ctx_, *c_.data, c_.batch_size);
    e.test_accuracy = a.test;
    e.validation_accuracy = a.validation;
  }
  if (req_.checkpoint && !c_.checkpoint.empty()) {
    write_checkpoint();
    e.checkpointed = true;
  }
  return e;
}

void evaluator_core::write_checkpoint() {
  net::checkpoint c;
  c.architecture = net_.architecture();
  c.epoch = req_.epochs_done;
  c.step = req_.steps;
  c.epoch_samples = req_.epoch_samples;
  c.params = net_.state();
  c.optimizer_kind = c_.algorithm;
  c.optimizer = std::move(rule_state_);
  // The shards answer in any order; the file does not depend on it.
  std::sort(c.optimizer.begin(), c.optimizer.end(),
            [](const named_tensor& a, const named_tensor& b) { return a.name < b.name; });
  c.shard_versions = versions_;
  net::save_checkpoint(c_.checkpoint, c);
}

} // namespace troupe::actors
