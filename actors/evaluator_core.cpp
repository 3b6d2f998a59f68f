#include "actors/evaluator_core.hpp"

#include <algorithm>
#include <cstring>

#include "net/checkpoint.hpp"
#include "net/tensor_codec.hpp"

namespace troupe::actors {

evaluator_core::evaluator_core(config c, model::model net)
    : c_(std::move(c)), net_(std::move(net)), client_(c_.self, c_.shards, net_.layout()) {
  flat_ = net_.flatten();
}

std::vector<outgoing> evaluator_core::begin(const snapshot_request& r) {
  if (active_) throw error("a snapshot is already in progress (epoch " + std::to_string(req_.epoch) + ")");
  req_ = r;
  active_ = true;
  rule_state_.clear();
  versions_.assign(c_.shards.size(), 0);
  std::vector<outgoing> pulls = client_.pull_all(r.checkpoint, r.steps);
  if (c_.hogwild) c_.hogwild->read(flat_.values.data());
  return pulls;
}

bool evaluator_core::on_params(const net::message& m) { return on_params(net::envelope_reader(m, net::peer_limits())); }

bool evaluator_core::on_params(const net::envelope_reader& r) {
  // A pull asked again (retry()) may be answered twice; the first answer counts.
  if (!active_) return false;
  const param_client::accepted a = client_.accept(r);
  if (!a.first) return false;
  const model::shard_range& range = c_.shards[a.holder].range;
  std::memcpy(flat_.values.data() + range.begin, a.values, range.numel() * sizeof(float));
  versions_[a.holder] = a.version;
  const std::string prefix = "shard" + std::to_string(c_.shards[a.holder].address.index) + "/";
  for (auto& t : net::decode(r.root().getParams().getRuleState(), "shard state"))
    rule_state_.push_back({prefix + t.name, std::move(t.value)});
  return true;
}

evaluation_result evaluator_core::finish() {
  if (!complete()) throw error("the snapshot is not complete (waiting for " + missing() + ")");
  active_ = false;
  evaluation_result e;
  e.epoch = req_.epoch;
  e.periodic = req_.periodic;
  // Batch norm's statistics stay with the workers' replicas: estimated here for the snapshot.
  if (!c_.data->text)
    train::estimate_batch_norm(net_, ctx_, c_.data->sets.train, c_.data->norm, c_.batch_size, batch_norm_batches,
                               req_.epoch);
  if (req_.evaluate) {
    const train::accuracies a = train::score_sets(net_, ctx_, *c_.data, c_.batch_size, c_.sample_tokens);
    e.test_accuracy = a.test;
    e.validation_accuracy = a.validation;
    e.test_loss = a.test_loss;
    e.validation_loss = a.validation_loss;
    e.sample = a.sample;
  }
  if (req_.checkpoint && !c_.checkpoint.empty()) {
    write_checkpoint();
    e.checkpointed = true;
  }
  return e;
}

void evaluator_core::write_checkpoint() {
  net::checkpoint c;
  c.vocabulary = c_.data->vocabulary();
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
