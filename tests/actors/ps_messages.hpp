// Hand-built parameter-server messages, addresses and small models for the actor tests.
#pragma once

#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "actors/messages.hpp"
#include "actors/shard_core.hpp"
#include "model/nn.hpp"
#include "net/message.hpp"
#include "net/tensor_codec.hpp"
#include "train/plan.hpp"

namespace troupe::testing {

inline net::address worker_addr(uint32_t i, uint32_t node = 0) { return {node, net::role::worker, i}; }
inline net::address loader_addr(uint32_t i, uint32_t node = 0) { return {node, net::role::loader, i}; }
inline net::address shard_addr(uint32_t i, uint32_t node = 0) { return {node, net::role::shard, i}; }
inline net::address evaluator_addr() { return {0, net::role::evaluator, 0}; }
inline net::address coordinator_addr() { return net::coordinator_address(0); }

using tensor_list = std::vector<std::pair<shape, std::vector<float>>>;

/// A PushGradient from `from` to shard `shard` carrying `tensors` as the range
/// (first, offset) of a layout: one flat payload, as workers lay it out.
inline net::message push_message(const net::address& from, uint64_t base, const tensor_list& tensors,
                                 uint32_t shard = 0, uint32_t first = 0, int64_t offset = 0,
                                 uint16_t version = wire::SCHEMA_VERSION) {
  auto b = net::make_builder();
  auto env = net::init_envelope(*b, from, shard_addr(shard));
  env.setSchemaVersion(version);
  auto p = env.initPushGradient();
  p.setShard(shard);
  p.setBaseVersion(base);
  p.setStep(base + 1);
  std::vector<shape> shapes;
  for (const auto& t : tensors) shapes.push_back(t.first);
  float* dst = net::init_flat(p.initValues(), first, offset, shapes);
  for (const auto& t : tensors) {
    std::memcpy(dst, t.second.data(), t.second.size() * sizeof(float));
    dst += t.second.size();
  }
  return net::message::from_builder(std::move(b));
}
/// A push from worker `worker` (on node 0).
inline net::message push_message(uint32_t worker, uint64_t base, const tensor_list& tensors) {
  return push_message(worker_addr(worker), base, tensors);
}

/// A Params from shard `shard` to `to`: the range (first, offset) of a layout holding `tensors`.
inline net::message params_message(uint32_t shard, const net::address& to, uint64_t version, uint32_t first,
                                   int64_t offset, const tensor_list& tensors, uint64_t tau = 0,
                                   bool rejected = false, const std::vector<named_tensor>& state = {}) {
  auto b = net::make_builder();
  auto p = net::init_envelope(*b, shard_addr(shard), to).initParams();
  p.setShard(shard);
  p.setVersion(version);
  p.setAppliedStaleness(tau);
  p.setRejected(rejected);
  std::vector<shape> shapes;
  for (const auto& t : tensors) shapes.push_back(t.first);
  float* dst = net::init_flat(p.initValues(), first, offset, shapes);
  for (const auto& t : tensors) {
    std::memcpy(dst, t.second.data(), t.second.size() * sizeof(float));
    dst += t.second.size();
  }
  if (!state.empty()) net::encode(state, p.initRuleState(static_cast<unsigned>(state.size())));
  return net::message::from_builder(std::move(b));
}

/// A Params reply read back: its header, addresses and values (flat).
struct params_view {
  uint64_t version = 0, tau = 0;
  bool rejected = false;
  uint32_t shard = 0, first = 0;
  int64_t offset = 0;
  net::address source, destination;
  std::vector<float> values;
};
inline params_view read_params(const net::message& m) {
  net::envelope_reader r(m);
  REQUIRE(r.root().which() == wire::Envelope::PARAMS);
  auto p = r.root().getParams();
  params_view v;
  v.version = p.getVersion();
  v.tau = p.getAppliedStaleness();
  v.rejected = p.getRejected();
  v.shard = p.getShard();
  v.source = net::read_address(r.root().getSource());
  v.destination = net::read_address(r.root().getDestination());
  const net::flat_view f = net::view(p.getValues(), "test");
  v.first = f.first;
  v.offset = f.offset;
  v.values.assign(f.data, f.data + f.numel);
  return v;
}

/// The payload of a Params: where its parameters live.
inline const float* first_payload(const net::message& m) {
  net::envelope_reader r(m);
  return net::view(r.root().getParams().getValues(), "test").data;
}

/// The workers' test model: one dense layer, 3 inputs, 2 classes (weight [2, 3], bias [2]).
inline model::model tiny_model() {
  model::model m = nn::sequential(nn::dense(3, 2));
  m.build({3}, 1);
  return m;
}

/// Its test batch: 2 samples of 3 features, labels {1, 0}.
inline tensor tiny_images() { return tensor::from({2, 3}, {1, 0, -1, 0.5f, 2, 1}); }
inline const std::vector<int32_t> tiny_labels{1, 0};

/// A Batch message of `images` and `labels` from loader 0 to worker 0.
inline net::message batch_message(const tensor& images, const std::vector<int32_t>& labels,
                                  const net::address& to = worker_addr(0)) {
  auto b = net::make_builder();
  auto batch = net::init_envelope(*b, loader_addr(to.index, to.node), to).initBatch();
  net::encode(images, batch.initImages());
  auto l = batch.initLabels(static_cast<unsigned>(labels.size()));
  for (unsigned i = 0; i < l.size(); ++i) l.set(i, labels[i]);
  return net::message::from_builder(std::move(b));
}

/// A gradient for small_tensors(): a [2] = {a0, a1}, b [1] = {b0}.
inline tensor_list grad(float a0, float a1, float b0) { return {{shape{2}, {a0, a1}}, {shape{1}, {b0}}}; }

inline model::update_config small_rule(model::algorithm_kind rule, int workers, float lr = 0.5f) {
  model::update_config c;
  c.rule = rule;
  c.lr = lr;
  c.workers = workers;
  return c;
}

/// Two tensors: a [2] = {1, 2} and b [1] = {3}.
inline std::vector<named_tensor> small_tensors() {
  return {{"a", tensor::from({2}, {1, 2})}, {"b", tensor::from({1}, {3})}};
}

/// Shard `index` of a layout, holding tensors [first, last) = elements [begin, end), for workers 0..workers-1.
inline train::shard_plan shard_plan_of(uint32_t index, uint32_t first, uint32_t last, int64_t begin, int64_t end,
                                       int workers = 1) {
  train::shard_plan p;
  p.address = shard_addr(index);
  p.range = {first, last, begin, end};
  for (int w = 0; w < workers; ++w) p.clients.push_back(worker_addr(static_cast<uint32_t>(w)));
  return p;
}

/// The one shard of small_tensors(): tensors [0, 2), elements [0, 3).
inline train::shard_plan small_plan(int workers = 1) { return shard_plan_of(0, 0, 2, 0, 3, workers); }

/// A shard of small_tensors() (constant learning rate).
inline actors::shard_core small_shard(const model::update_config& rule,
                                      net::reader_limits limits = net::peer_limits()) {
  return actors::shard_core(small_plan(rule.workers), small_tensors(), rule, model::lr_schedule::constant, 100,
                            kernels::context{}, limits);
}
inline actors::shard_core small_shard(model::algorithm_kind rule, int workers, float lr = 0.5f) {
  return small_shard(small_rule(rule, workers, lr));
}

/// A worker's plan: worker `i` on node 0 fed by loader `i`.
inline train::worker_plan worker_plan_of(uint32_t i) {
  train::worker_plan p;
  p.address = worker_addr(i);
  p.loader = loader_addr(i);
  return p;
}

} // namespace troupe::testing
