#include "actors/param_holder.hpp"

#include "kernels/kernels.hpp"
#include "net/tensor_codec.hpp"

namespace troupe::actors {

param_holder::param_holder(net::address self, uint32_t shard, const model::shard_range& range,
                           std::vector<shape> shapes, const float* initial, const kernels::context& ctx)
    : self_(self), shard_(shard), range_(range), shapes_(std::move(shapes)),
      ctx_(kernels::context::with_threads(1)) {
  int64_t n = 0;
  for (const shape& s : shapes_) n += s.numel();
  if (n != range_.numel())
    throw error(net::to_string(self_) + ": tensors of " + std::to_string(n) + " parameters for a range of " +
                std::to_string(range_.numel()));
  current_ = build(self_, initial, 0, false, nullptr, &w_);
  ctx_ = ctx;
}

net::message param_holder::build(const net::address& to, const float* w, uint64_t tau, bool rejected,
                                 const std::vector<named_tensor>* state, float** payload) const {
  const std::size_t values = static_cast<std::size_t>(size()) * sizeof(float);
  std::size_t bytes = net::written_inline_bytes(values) + 64 * shapes_.size();
  if (state)
    for (const auto& t : *state) bytes += static_cast<std::size_t>(t.value.numel()) * sizeof(float) + 64 + t.name.size();
  auto b = net::make_builder(bytes);
  auto p = net::init_envelope(*b, self_, to).initParams();
  p.setShard(shard_);
  p.setVersion(version_);
  p.setAppliedStaleness(tau);
  p.setRejected(rejected);
  std::shared_ptr<const void> keep;
  float* dst = net::init_flat(*b, p.initValues(), range_.first, range_.begin, shapes_, keep);
  if (size() > 0) kernels::copy(ctx_, size(), w, dst);
  if (state && !state->empty()) net::encode(*state, p.initRuleState(static_cast<unsigned>(state->size())));
  if (payload) *payload = dst;
  return net::message::from_builder(std::move(b), std::move(keep));
}

float* param_holder::writable() {
  if (!current_.exclusive_builder()) {
    // current_ stays held until the copy is made: w_ lies in its payload.
    net::message next = build(self_, w_, current_tau_, current_rejected_, nullptr, &w_);
    current_ = std::move(next);
    current_version_ = version_;
  }
  return w_;
}

void param_holder::assign(const float* values) {
  float* w = writable();
  if (size() > 0) kernels::copy(ctx_, size(), values, w);
  bump();
}

net::message param_holder::reply(const net::address& to, uint64_t tau, bool rejected) {
  if (auto* b = current_.exclusive_builder()) {
    auto env = b->getRoot<wire::Envelope>();
    net::write_address(env.getDestination(), to);
    auto p = env.getParams();
    p.setVersion(version_);
    p.setAppliedStaleness(tau);
    p.setRejected(rejected);
  } else if (current_version_ != version_ || current_tau_ != tau || current_rejected_ != rejected) {
    // current_ stays held until the copy is made: w_ lies in its payload, and
    // the peers that hold it too may let it go at any moment.
    net::message next = build(to, w_, tau, rejected, nullptr, &w_);
    current_ = std::move(next);
  }
  current_version_ = version_;
  current_tau_ = tau;
  current_rejected_ = rejected;
  return current_;
}

net::message param_holder::reply_with_state(const net::address& to, const std::vector<named_tensor>& state) const {
  return build(to, w_, 0, false, &state, nullptr);
}

} // namespace troupe::actors
