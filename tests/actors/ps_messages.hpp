// Hand-built parameter-server messages for the actor tests.
#pragma once

#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "actors/ps_core.hpp"
#include "model/nn.hpp"
#include "net/message.hpp"
#include "net/tensor_codec.hpp"

namespace troupe::testing {

/// A PushGradient from `worker` for shard 0 carrying `tensors`: encoded one by
/// one, or with `adjacent` payloads as workers lay them out.
inline net::message push_message(uint32_t worker, uint64_t base,
                                 const std::vector<std::pair<shape, std::vector<float>>>& tensors,
                                 bool adjacent = false) {
  auto b = std::make_unique<capnp::MallocMessageBuilder>();
  auto env = b->initRoot<wire::Envelope>();
  env.setSchemaVersion(wire::SCHEMA_VERSION);
  env.setSender(worker);
  auto p = env.initPushGradient();
  p.setWorker(worker);
  p.setShard(0);
  p.setBaseVersion(base);
  auto list = p.initTensors(static_cast<unsigned>(tensors.size()));
  if (adjacent) {
    std::vector<shape> shapes;
    for (const auto& t : tensors) shapes.push_back(t.first);
    const std::vector<float*> dst = net::init_tensors(list, shapes);
    for (std::size_t i = 0; i < tensors.size(); ++i)
      std::memcpy(dst[i], tensors[i].second.data(), tensors[i].second.size() * sizeof(float));
    return net::message::from_builder(std::move(b));
  }
  for (unsigned i = 0; i < tensors.size(); ++i) {
    auto t = list[i];
    auto dims = t.initShape(static_cast<unsigned>(tensors[i].first.rank()));
    for (unsigned j = 0; j < dims.size(); ++j) dims.set(j, tensors[i].first[j]);
    t.setDtype(wire::DType::F32);
    auto data = t.initData(static_cast<unsigned>(tensors[i].second.size() * sizeof(float)));
    std::memcpy(data.begin(), tensors[i].second.data(), data.size());
  }
  return net::message::from_builder(std::move(b));
}

/// The tensors of a Params reply, flattened, and its header fields.
struct params_view {
  uint64_t version = 0, tau = 0;
  bool rejected = false;
  std::vector<float> values;
};
inline params_view read_params(const net::message& m) {
  net::envelope_reader r(m);
  REQUIRE(r.root().which() == wire::Envelope::PARAMS);
  auto p = r.root().getParams();
  params_view v{p.getVersion(), p.getAppliedStaleness(), p.getRejected(), {}};
  for (auto t : p.getTensors()) {
    auto tv = net::view(t, "test");
    v.values.insert(v.values.end(), tv.data, tv.data + tv.numel());
  }
  return v;
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

/// A Batch message of `images` and `labels`.
inline net::message batch_message(const tensor& images, const std::vector<int32_t>& labels) {
  auto b = std::make_unique<capnp::MallocMessageBuilder>();
  auto env = b->initRoot<wire::Envelope>();
  env.setSchemaVersion(wire::SCHEMA_VERSION);
  auto batch = env.initBatch();
  net::encode(images, batch.initImages());
  auto l = batch.initLabels(static_cast<unsigned>(labels.size()));
  for (unsigned i = 0; i < l.size(); ++i) l.set(i, labels[i]);
  return net::message::from_builder(std::move(b));
}

/// The payload of a message's first tensor: where its parameters live.
inline const float* first_payload(const net::message& m) {
  net::envelope_reader r(m);
  auto p = r.root().getParams();
  return net::view(p.getTensors()[0], "test").data;
}

inline std::vector<std::pair<shape, std::vector<float>>> grad(float a0, float a1, float b0) {
  return {{shape{2}, {a0, a1}}, {shape{1}, {b0}}};
}

inline model::update_config small_rule(const std::string& rule, int workers, float lr = 0.5f) {
  model::update_config c;
  c.rule = rule;
  c.lr = lr;
  c.workers = workers;
  return c;
}

/// Two tensors: a [2] = {1, 2} and b [1] = {3}.
inline std::vector<named_tensor> small_tensors() { return {{"a", tensor::from({2}, {1, 2})}, {"b", tensor::from({1}, {3})}}; }

/// A shard of small_tensors().
inline actors::shard_core small_shard(const std::string& rule, int workers, float lr = 0.5f) {
  return actors::shard_core(0, small_tensors(), small_rule(rule, workers, lr), "constant", 100);
}

} // namespace troupe::testing
