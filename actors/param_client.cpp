#include "actors/param_client.hpp"

#include <algorithm>

#include "actors/messages.hpp"
#include "net/protocol.hpp"
#include "net/tensor_codec.hpp"

namespace troupe::actors {

void staleness_tally::add(uint64_t tau, bool was_rejected) {
  sum += tau;
  ++count;
  max = std::max(max, tau);
  if (was_rejected) ++rejected;
}

void staleness_tally::fill(train::step_report& r) const {
  r.mean_staleness = count ? static_cast<double>(sum) / static_cast<double>(count) : 0.0;
  r.max_staleness = static_cast<uint32_t>(std::min<uint64_t>(max, UINT32_MAX));
  r.rejected = static_cast<uint32_t>(std::min<uint64_t>(rejected, UINT32_MAX));
}

param_client::param_client(net::address self, std::vector<train::shard_plan> holders,
                           const model::param_layout& layout)
    : self_(self), holders_(std::move(holders)), layout_(layout), version_(holders_.size(), 0),
      push_(holders_.size()), answered_(holders_.size(), false), sent_(holders_.size(), false),
      waiting_(static_cast<int>(holders_.size())) {
  for (const auto& h : holders_) shapes_.push_back(layout_.range_shapes(h.range));
}

std::vector<outgoing> param_client::pull_all(bool with_state, uint64_t steps) {
  with_state_ = with_state;
  steps_ = steps;
  std::fill(answered_.begin(), answered_.end(), false);
  waiting_ = static_cast<int>(holders_.size());
  pushed_ = false;
  return missing_pulls();
}

std::vector<outgoing> param_client::missing_pulls() const {
  std::vector<outgoing> out;
  for (std::size_t h = 0; h < holders_.size(); ++h)
    if (!answered_[h])
      out.push_back({holders_[h].address, make_pull(self_, holders_[h].address, with_state_, steps_)});
  return out;
}

std::size_t param_client::index_of(uint32_t shard) const {
  for (std::size_t h = 0; h < holders_.size(); ++h)
    if (holders_[h].address.index == shard) return h;
  throw net::message_error(net::reject_reason::wrong_shape, net::to_string(self_) + ": Params of shard " +
                                                                std::to_string(shard) + ", not one it pulls from");
}

param_client::accepted param_client::accept(const net::envelope_reader& r, staleness_tally* tally,
                                           const std::vector<bool>* keep_version) {
  if (r.root().which() != wire::Envelope::PARAMS)
    throw net::message_error(net::reject_reason::unknown_kind, net::to_string(self_) + ": expected Params");
  auto p = r.root().getParams();
  const std::size_t h = index_of(p.getShard());
  const net::address from = net::read_address(r.root().getSource());
  if (from != holders_[h].address)
    throw net::message_error(net::reject_reason::malformed, net::to_string(self_) + ": Params of shard " +
                                                                std::to_string(p.getShard()) + " from " +
                                                                net::to_string(from));
  const net::flat_view v = net::view(p.getValues(), "params");
  const model::shard_range& range = holders_[h].range;
  net::require_range(v, range.first, range.begin, shapes_[h], "params of shard " + std::to_string(p.getShard()));
  if (ignore_stale_ && pushed_ && !p.getRejected() && p.getVersion() <= version_[h])
    return {h, v.data, p.getVersion(), false, false};
  if (!keep_version || !(*keep_version)[h]) version_[h] = p.getVersion();
  accepted a{h, v.data, p.getVersion(), !answered_[h], false};
  if (a.first) {
    answered_[h] = true;
    --waiting_;
    if (pushed_ && tally) tally->add(p.getAppliedStaleness(), p.getRejected());
    a.round_done = waiting_ == 0 && pushed_;
  }
  return a;
}

std::string param_client::missing() const {
  std::string out;
  for (std::size_t h = 0; h < holders_.size(); ++h)
    if (!answered_[h]) out += (out.empty() ? "" : ", ") + net::to_string(holders_[h].address);
  return out;
}

float* param_client::open_push(std::size_t h) {
  return actors::open_push(push_[h], self_, holders_[h].address, holders_[h].range, shapes_[h]);
}

void param_client::push_one(std::size_t h, uint64_t step, std::vector<outgoing>& out) {
  auto p = push_[h].exclusive_builder()->getRoot<wire::Envelope>().getPushGradient();
  p.setBaseVersion(version_[h]);
  p.setStep(step);
  out.push_back({holders_[h].address, push_[h]});
  if (answered_[h]) ++waiting_;
  answered_[h] = false;
  sent_[h] = true;
  pushed_ = true;
  with_state_ = false;
  steps_ = 0;
}

void param_client::push(uint64_t step, std::vector<outgoing>& out) {
  for (std::size_t h = 0; h < holders_.size(); ++h)
    if (!sent_[h]) push_one(h, step, out);
  std::fill(sent_.begin(), sent_.end(), false);
}

} // namespace troupe::actors
