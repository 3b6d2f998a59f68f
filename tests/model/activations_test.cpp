// Activations owned by the call (model::activations): several micro-batches
// in flight on one model, outputs written where the caller says, parameters
// bound to the caller's flat buffers.
#include <catch2/catch.hpp>

#include <random>

#include "model/loss.hpp"
#include "model/nn.hpp"
#include "model/zoo.hpp"
#include "tests/gradcheck.hpp"

using namespace troupe;
using namespace troupe::nn;
using Catch::Contains;

namespace {
const kernels::context ctx = testing::test_context();

struct sample {
  tensor x;
  std::vector<int32_t> labels;
};

/// n images [1, side, side] with labels in [0, classes).
sample images(int64_t n, uint32_t seed, int64_t side = 8, int32_t classes = 10) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  sample s{tensor::empty({n, 1, side, side}), {}};
  for (int64_t i = 0; i < s.x.numel(); ++i) s.x.at(i) = d(rng);
  for (int64_t i = 0; i < n; ++i) s.labels.push_back(static_cast<int32_t>(rng() % classes));
  return s;
}

/// n rows [t, features] of activations, labelled with next tokens in [0, vocab).
sample features(int64_t n, int64_t t, int64_t f, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  sample s{tensor::empty({n, t, f}), {}};
  for (int64_t i = 0; i < s.x.numel(); ++i) s.x.at(i) = d(rng);
  for (int64_t i = 0; i < n * t; ++i) s.labels.push_back(static_cast<int32_t>(rng() % vocab));
  return s;
}

/// n windows of `t` token ids in [0, vocab), each labelled with its next tokens.
sample tokens(int64_t n, int64_t t, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  sample s{tensor::empty({n, t}), {}};
  for (int64_t i = 0; i < s.x.numel(); ++i) s.x.at(i) = static_cast<float>(rng() % vocab);
  for (int64_t i = 0; i < s.x.numel(); ++i) s.labels.push_back(static_cast<int32_t>(rng() % vocab));
  return s;
}

std::vector<float> grads_of(model::model& net) {
  std::vector<float> out;
  for (model::parameter* p : net.parameters()) {
    const std::vector<float> g = p->grad.to_vector();
    out.insert(out.end(), g.begin(), g.end());
  }
  return out;
}

struct call_result {
  std::vector<float> y, grads, dx;
};

/// One call's backward from the loss of the forward's output y.
call_result finish(model::model& net, const tensor& y, const sample& s, model::activations* a) {
  call_result r;
  r.y = y.to_vector();
  tensor dlogits;
  model::cross_entropy(ctx, y, s.labels, &dlogits);
  const tensor& dx = a ? net.backward(ctx, dlogits, *a) : net.backward(ctx, dlogits);
  if (dx.defined()) r.dx = dx.to_vector();
  r.grads = grads_of(net);
  return r;
}

/// Two calls one after the other (the model's own activations), then
/// interleaved with their own: forward a, forward b, backward b, backward a.
/// Same outputs, parameter gradients and input gradients, to the bit.
void check_interleaved(model::model& net, const sample& a, const sample& b) {
  const call_result ra = finish(net, net.forward(ctx, a.x, true), a, nullptr);
  const call_result rb = finish(net, net.forward(ctx, b.x, true), b, nullptr);

  model::activations act_a = net.make_activations(), act_b = net.make_activations();
  const tensor ya = net.forward(ctx, a.x, true, act_a);  // a shallow copy: act_a's buffer
  const tensor& yb = net.forward(ctx, b.x, true, act_b);
  const call_result ib = finish(net, yb, b, &act_b);
  const call_result ia = finish(net, ya, a, &act_a);
  CHECK(ia.y == ra.y);
  CHECK(ib.y == rb.y);
  CHECK(ia.grads == ra.grads);
  CHECK(ib.grads == rb.grads);
  CHECK(ia.dx == ra.dx);
  CHECK(ib.dx == rb.dx);
}
} // namespace

TEST_CASE("micro-batches in flight on one model, each with its own activations, compute what one call at a time does",
          "[model][activations]") {
  SECTION("convolutions, batch norm with a fused ReLU, pooling, dense") {
    auto net = sequential(conv2d(1, 4, 3).padding(1), batch_norm(4), relu(), max_pool2d(2), conv2d(4, 4, 3),
                          relu(), global_avg_pool(), dense(4, 10));
    net.build({1, 8, 8}, 3);
    check_interleaved(net, images(3, 1), images(5, 2));
  }
  SECTION("residual blocks with a projection") {
    auto net = sequential(conv2d(1, 4, 3).padding(1), relu(),
                          residual(conv2d(4, 8, 3).padding(1), batch_norm(8), relu(), conv2d(8, 8, 3).padding(1))
                              .projection(conv2d(4, 8, 1)),
                          relu(), avg_pool2d(2), flatten(), dense(128, 10));
    net.build({1, 8, 8}, 4);
    check_interleaved(net, images(2, 3), images(4, 4));
  }
  SECTION("a small GPT: embeddings, transformer blocks (attention, layer norm, GELU), the head") {
    auto net = zoo::gpt(13, 6, 8, 2, 2);
    net.build({6}, 5);
    check_interleaved(net, tokens(2, 6, 13, 5), tokens(3, 6, 13, 6));
  }
  SECTION("a stage after the first (its input gradient is computed)") {
    auto whole = zoo::gpt(13, 6, 8, 2, 2);
    whole.build({6}, 6);
    model::model stage = whole.slice(3, 6);  // the second block, the final norm and the head
    check_interleaved(stage, features(2, 6, 8, 13, 7), features(2, 6, 8, 13, 8));
  }
}

TEST_CASE("a call writes its output and its input gradient into the caller's memory, and lets go of it after",
          "[model][activations]") {
  auto whole = zoo::gpt(11, 5, 8, 2, 2);
  whole.build({5}, 9);
  model::model net = whole.slice(3, 6);  // a last stage: [2, 5, 8] in, logits [2, 5, 11] out
  const sample s = features(2, 5, 8, 11, 10);
  const call_result ref = finish(net, net.forward(ctx, s.x, true), s, nullptr);

  model::activations a = net.make_activations();
  std::vector<float> out_mem(2 * 5 * 11, -7.0f), dx_mem(2 * 5 * 8, -7.0f);
  tensor out = tensor::wrap({2, 5, 11}, out_mem.data());
  tensor dx = tensor::wrap({2, 5, 8}, dx_mem.data());
  const tensor& y = net.forward(ctx, s.x, true, a, &out);
  CHECK(y.data() == out_mem.data());
  CHECK(out_mem == ref.y);
  tensor dlogits;
  model::cross_entropy(ctx, y, s.labels, &dlogits);
  const tensor& g = net.backward(ctx, dlogits, a, &dx);
  CHECK(g.data() == dx_mem.data());
  CHECK(dx_mem == ref.dx);
  CHECK(grads_of(net) == ref.grads);

  // The next calls name no memory: the caller's stays as it was.
  const std::vector<float> kept_out = out_mem, kept_dx = dx_mem;
  tensor x2 = s.x.clone();
  for (int64_t i = 0; i < x2.numel(); ++i) x2.at(i) += 0.5f;
  const tensor& y2 = net.forward(ctx, x2, true, a);
  CHECK(y2.data() != out_mem.data());
  net.backward(ctx, dlogits, a);
  CHECK(out_mem == kept_out);
  CHECK(dx_mem == kept_dx);

  // Memory of another shape is refused, naming both.
  tensor wrong = tensor::wrap({2, 5, 8}, dx_mem.data());
  CHECK_THROWS_WITH(net.forward(ctx, s.x, true, a, &wrong), Contains("[2, 5, 8]") && Contains("[2, 5, 11]"));
}

TEST_CASE("a layer that passes a view on (flatten) has its output copied into the caller's memory",
          "[model][activations]") {
  auto net = sequential(conv2d(1, 2, 3).padding(1), relu(), flatten());
  net.build({1, 4, 4}, 2);
  const tensor small = images(3, 12, 4).x;
  const std::vector<float> ref = net.forward(ctx, small, true).to_vector();
  model::activations a = net.make_activations();
  std::vector<float> mem(3 * 32, 0.0f);
  tensor out = tensor::wrap({3, 32}, mem.data());
  net.forward(ctx, small, true, a, &out);
  CHECK(mem == ref);
}

TEST_CASE("activations belong to the model that made them", "[model][activations]") {
  auto net = zoo::mlp();
  net.build({1, 28, 28});
  auto other = sequential(flatten(), dense(784, 10));
  other.build({1, 28, 28});
  model::activations a = other.make_activations();
  CHECK_THROWS_WITH(net.forward(ctx, tensor::zeros({1, 1, 28, 28}), true, a),
                    Contains("activations of 2 layers") && Contains("make_activations"));
  model::activations none;
  CHECK_THROWS_WITH(net.backward(ctx, tensor::zeros({1, 10}), none), Contains("activations of 0 layers"));
}

TEST_CASE("bind points a model's parameters at the caller's values and gradients", "[model][activations]") {
  auto net = sequential(flatten(), dense(16, 6), relu(), dense(6, 3));
  net.build({1, 4, 4}, 5);
  const int64_t n = net.layout().numel();
  const sample s = images(4, 13, 4, 3);

  auto twin = sequential(flatten(), dense(16, 6), relu(), dense(6, 3));
  twin.build({1, 4, 4}, 5);  // the same seed: the same values
  const model::model::flat_buffers flat = twin.flatten();
  const call_result ref = finish(twin, twin.forward(ctx, s.x, true), s, nullptr);

  // Other values in the model itself: bind replaces them with the caller's.
  for (model::parameter* p : net.parameters()) p->value.fill(3.0f);
  const std::vector<float> values = flat.values.to_vector();
  std::vector<float> grads(static_cast<std::size_t>(n), -1.0f);
  net.bind(values.data(), grads.data());
  const call_result r = finish(net, net.forward(ctx, s.x, true), s, nullptr);
  CHECK(r.y == ref.y);
  CHECK(grads == flat.grads.to_vector());
  CHECK(values == flat.values.to_vector());  // read, never written
  for (model::parameter* p : net.parameters()) CHECK(p->value.read_only());
}
