// The sequence layers of model/nn.hpp (embedding, positional_embedding,
// layer_norm, gelu, sequence_dense, causal_self_attention, transformer_block)
// and zoo::gpt: forward against naive double references, numerical gradients
// of every parameter and input, the causal property, shapes, names, errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/sequence.hpp"
#include "model/nn.hpp"
#include "model/zoo.hpp"
#include "tests/gradcheck.hpp"

using namespace troupe;
using namespace troupe::nn;
using Catch::Contains;

namespace {
const kernels::context ctx = testing::test_context();

/// A layer made, shape-inferred for samples of `sample` and initialised (seed 3).
template <class L>
std::unique_ptr<model::layer> built(const L& l, const shape& sample) {
  auto out = l.make();
  out->infer(sample, "the test input");
  std::mt19937_64 rng(3);
  out->initialize(rng);
  return out;
}

/// Token ids of [b, t] as the model's float input.
tensor random_tokens(int64_t b, int64_t t, int32_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  tensor x = tensor::empty({b, t});
  for (int64_t i = 0; i < x.numel(); ++i) x.at(i) = static_cast<float>(rng() % static_cast<uint64_t>(vocab));
  return x;
}

/// Largest |a - want| / (1 + |want|).
double worst_error(const tensor& a, const std::vector<double>& want) {
  REQUIRE(static_cast<std::size_t>(a.numel()) == want.size());
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    worst = std::max(worst, std::abs(a.at(i) - want[i]) / (1 + std::abs(want[i])));
  return worst;
}

/// y [rows, out] = x [rows, in] W^T + b, in double.
std::vector<double> naive_dense(const std::vector<double>& x, const tensor& w, const tensor& b) {
  const int64_t out = w.dim(0), in = w.dim(1), rows = static_cast<int64_t>(x.size()) / in;
  std::vector<double> y(static_cast<std::size_t>(rows * out));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = b.defined() ? b.at(o) : 0.0;
      for (int64_t i = 0; i < in; ++i) s += x[r * in + i] * double(w.at(o * in + i));
      y[r * out + o] = s;
    }
  return y;
}

std::vector<double> as_double(const tensor& t) {
  std::vector<double> v(static_cast<std::size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = t.at(i);
  return v;
}

/// Causal multi-head attention over qkv [b, t, 3c], in double: out [b, t, c].
std::vector<double> naive_attention(const std::vector<double>& qkv, int64_t b, int64_t t, int64_t c, int64_t heads) {
  const int64_t d = c / heads;
  std::vector<double> out(static_cast<std::size_t>(b * t * c), 0.0);
  auto at = [&](int64_t n, int64_t i, int64_t part, int64_t ch) { return qkv[(n * t + i) * 3 * c + part * c + ch]; };
  for (int64_t n = 0; n < b; ++n)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < t; ++i) {
        std::vector<double> s(static_cast<std::size_t>(i + 1));
        double mx = -1e300, z = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < d; ++e) dot += at(n, i, 0, h * d + e) * at(n, j, 1, h * d + e);
          s[j] = dot / std::sqrt(double(d));
          mx = std::max(mx, s[j]);
        }
        for (auto& v : s) z += (v = std::exp(v - mx));
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t e = 0; e < d; ++e) out[(n * t + i) * c + h * d + e] += s[j] / z * at(n, j, 2, h * d + e);
      }
  return out;
}

/// Checks every parameter's gradient and, when `input` is given, the input's,
/// against central differences of loss = sum(y * r) for fixed random r.
void check_layer_gradients(model::layer& l, tensor& x, bool input, double tol = 3e-2) {
  l.set_needs_input_grad(input);
  const tensor& y0 = l.forward(ctx, x, true);
  const tensor r = testing::random_tensor(y0.shape(), 99);
  auto loss = [&] { return testing::dot(l.forward(ctx, x, true), r); };
  loss();
  const tensor& g = l.backward(ctx, r);
  const tensor dx = g.defined() ? g.clone() : tensor();
  for (model::parameter* p : l.parameters()) {
    INFO("parameter " << p->name);
    tensor g = p->grad.clone();
    testing::check_gradient(p->value, g, loss, 1e-2, tol, 60);
  }
  if (input) {
    INFO("input gradient");
    testing::check_gradient(x, dx, loss, 1e-2, tol, 60);
  }
}

/// Every parameter of a model against central differences of the sequence cross-entropy.
void check_model_gradients(model::model& net, const tensor& x, const std::vector<int32_t>& targets) {
  const auto ids = kernels::token_ids::of(targets, x.dim(0));
  tensor dlogits;
  kernels::sequence_cross_entropy(ctx, net.forward(ctx, x, true), ids, &dlogits);
  net.backward(ctx, dlogits);
  auto loss = [&] { return double(kernels::sequence_cross_entropy(ctx, net.forward(ctx, x, true), ids, nullptr)); };
  for (auto* p : net.parameters()) {
    INFO("parameter " << p->name);
    tensor g = p->grad.clone();
    testing::check_gradient(p->value, g, loss, 1e-2, 3e-2, 12);
  }
}

} // namespace

TEST_CASE("embedding looks rows up and checks every token id", "[sequence_layers]") {
  auto l = built(embedding(7, 3), {4});
  const tensor x = random_tokens(2, 4, 7, 1);
  const tensor& y = l->forward(ctx, x, true);
  REQUIRE(y.shape() == shape{2, 4, 3});
  const tensor w = l->parameters()[0]->value;
  CHECK(w.shape() == shape{7, 3});
  std::vector<double> want;
  for (int64_t i = 0; i < x.numel(); ++i)
    for (int64_t c = 0; c < 3; ++c) want.push_back(w.at(static_cast<int64_t>(x.at(i)) * 3 + c));
  CHECK(worst_error(y, want) == 0);

  tensor bad = x.clone();
  bad.at(5) = 2.5f;
  CHECK_THROWS_WITH(l->forward(ctx, bad, true),
                    Contains("embedding(7 -> 3): token id 2.5 at batch 1, position 1 is not an integer in [0, 7)"));
  bad.at(5) = 7;
  CHECK_THROWS_WITH(l->forward(ctx, bad, true), Contains("token id 7 at batch 1, position 1"));
  bad.at(5) = -1;
  CHECK_THROWS_AS(l->forward(ctx, bad, true), error);
  bad.at(5) = std::nanf("");
  CHECK_THROWS_WITH(l->forward(ctx, bad, true), Contains("not an integer in [0, 7)"));
}

TEST_CASE("embedding gradient: its table numerically, none for its input", "[sequence_layers]") {
  auto l = built(embedding(5, 3), {6});
  tensor x = random_tokens(2, 6, 5, 2);
  check_layer_gradients(*l, x, false);
  CHECK_FALSE(l->backward(ctx, tensor::full({2, 6, 3}, 1.0f)).defined());
  l->set_needs_input_grad(true);  // a stage after the first: zeros, ids are discrete
  l->forward(ctx, x, true);
  const tensor dx = l->backward(ctx, tensor::full({2, 6, 3}, 1.0f));
  CHECK(dx.shape() == x.shape());
  CHECK(testing::dot(dx, dx) == 0);
}

TEST_CASE("positional_embedding adds rows 0..T-1 and checks the length", "[sequence_layers]") {
  auto l = built(positional_embedding(6, 4), {5, 4});
  tensor x = testing::random_tensor({3, 5, 4}, 4);
  const tensor& y = l->forward(ctx, x, true);
  const tensor w = l->parameters()[0]->value;
  std::vector<double> want;
  for (int64_t i = 0; i < x.numel(); ++i) want.push_back(double(x.at(i)) + w.at((i / 4 % 5) * 4 + i % 4));
  CHECK(worst_error(y, want) < 1e-6);
  CHECK_FALSE(y.shares_storage(x));
  check_layer_gradients(*l, x, true);

  CHECK_THROWS_WITH(sequential(embedding(3, 4), positional_embedding(6, 4)).build({7}),
                    "positional_embedding #2 expects [time, 4] with time <= 6 (its max_len), previous layer "
                    "(embedding #1) gives [7, 4]");
  CHECK_THROWS_WITH(l->forward(ctx, testing::random_tensor({1, 7, 4}, 1), true), Contains("time <= 6"));
}

TEST_CASE("layer_norm normalizes the last dimension", "[sequence_layers]") {
  auto l = built(layer_norm(5), {3, 5});
  for (auto* p : l->parameters()) p->value = testing::random_tensor(p->value.shape(), p->name.size());
  tensor x = testing::random_tensor({2, 3, 5}, 5, -2, 2);
  const tensor& y = l->forward(ctx, x, true);
  const tensor gamma = l->parameters()[0]->value, beta = l->parameters()[1]->value;
  std::vector<double> want;
  for (int64_t r = 0; r < 6; ++r) {
    double m = 0, v = 0;
    for (int64_t j = 0; j < 5; ++j) m += x.at(r * 5 + j) / 5.0;
    for (int64_t j = 0; j < 5; ++j) v += (x.at(r * 5 + j) - m) * (x.at(r * 5 + j) - m) / 5.0;
    for (int64_t j = 0; j < 5; ++j)
      want.push_back((x.at(r * 5 + j) - m) / std::sqrt(v + 1e-5) * gamma.at(j) + beta.at(j));
  }
  CHECK(worst_error(y, want) < 1e-5);
  check_layer_gradients(*l, x, true);
}

TEST_CASE("gelu is GPT-2's tanh approximation", "[sequence_layers]") {
  auto l = built(gelu(), {4, 3});
  tensor x = testing::random_tensor({2, 4, 3}, 6, -3, 3);
  const tensor& y = l->forward(ctx, x, true);
  std::vector<double> want;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = x.at(i);
    want.push_back(0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))));
  }
  CHECK(worst_error(y, want) < 1e-5);
  check_layer_gradients(*l, x, true);
}

TEST_CASE("sequence_dense applies one dense layer to every position", "[sequence_layers]") {
  auto l = built(sequence_dense(4, 3), {5, 4});
  for (auto* p : l->parameters()) p->value = testing::random_tensor(p->value.shape(), 7);
  tensor x = testing::random_tensor({2, 5, 4}, 8);
  const tensor& y = l->forward(ctx, x, true);
  REQUIRE(y.shape() == shape{2, 5, 3});
  CHECK(worst_error(y, naive_dense(as_double(x), l->parameters()[0]->value, l->parameters()[1]->value)) < 1e-5);
  check_layer_gradients(*l, x, true);

  auto net = sequential(sequence_dense(4, 3).bias(false));
  net.build({2, 6, 4});  // any leading dimensions are rows
  CHECK(net.output_shape() == shape{2, 6, 3});
  CHECK(net.num_parameters() == 12);
  CHECK_THROWS_WITH(sequential(embedding(5, 8), sequence_dense(6, 2)).build({3}),
                    "sequence_dense #2 expects inputs with 6 features last, previous layer (embedding #1) gives [3, 8]");
  CHECK_THROWS_WITH(sequential(sequence_dense(0, 2)), Contains("positive"));
}

TEST_CASE("causal_self_attention: fused qkv, the causal core and the output projection", "[sequence_layers]") {
  const int64_t b = 2, t = 4, c = 6, heads = 2;
  auto l = built(causal_self_attention(c, heads), {t, c});
  auto ps = l->parameters();
  REQUIRE(ps.size() == 4);
  CHECK(ps[0]->name == "qkv.weight");
  CHECK(ps[0]->value.shape() == shape{3 * c, c});
  CHECK(ps[1]->name == "qkv.bias");
  CHECK(ps[2]->name == "proj.weight");
  CHECK(ps[3]->name == "proj.bias");
  for (auto* p : ps) p->value = testing::random_tensor(p->value.shape(), p->name.size(), -0.5f, 0.5f);
  tensor x = testing::random_tensor({b, t, c}, 9);
  const tensor& y = l->forward(ctx, x, true);
  const auto qkv = naive_dense(as_double(x), ps[0]->value, ps[1]->value);
  const auto want = naive_dense(naive_attention(qkv, b, t, c, heads), ps[2]->value, ps[3]->value);
  CHECK(worst_error(y, want) < 1e-5);
  check_layer_gradients(*l, x, true);

  CHECK_THROWS_WITH(sequential(causal_self_attention(6, 4)), Contains("multiple of heads"));
  CHECK_THROWS_WITH(sequential(causal_self_attention(6, 2)).build({6}),
                    Contains("causal_self_attention #1 expects [time, features] with 6 features last"));
}

TEST_CASE("transformer_block: two pre-norm residual blocks, names and gradients", "[sequence_layers]") {
  const int64_t c = 4, r = 2;
  auto net = sequential(transformer_block(c, 2, r));
  net.build({3, c});
  CHECK(net.output_shape() == shape{3, c});
  CHECK(net.num_parameters() == (4 + 2 * r) * c * c + (9 + r) * c);
  const auto ps = net.parameters();
  REQUIRE(ps.size() == 12);
  CHECK(ps[0]->name == "0.transformer_block.0.residual.0.layer_norm.gamma");
  CHECK(ps[2]->name == "0.transformer_block.0.residual.1.causal_self_attention.qkv.weight");
  CHECK(ps[6]->name == "0.transformer_block.1.residual.0.layer_norm.gamma");
  CHECK(ps[8]->name == "0.transformer_block.1.residual.1.sequence_dense.weight");
  CHECK(ps[8]->value.shape() == shape{r * c, c});
  CHECK(ps[11]->name == "0.transformer_block.1.residual.3.sequence_dense.bias");
  CHECK_THAT(net.summary(), Contains("transformer_block") && Contains("residual(layer_norm(4), causal_self_attention"));

  auto l = built(transformer_block(c, 2, r), {3, c});
  tensor x = testing::random_tensor({2, 3, c}, 10);
  check_layer_gradients(*l, x, true);

  CHECK_THROWS_WITH(sequential(embedding(5, 8), transformer_block(6, 2)).build({3}),
                    "transformer_block #2: residual #1 inside: layer_norm #1 inside expects inputs with 6 features "
                    "last, previous layer (embedding #1) gives [3, 8]");
  CHECK_THROWS_WITH(sequential(transformer_block(6, 4)), Contains("multiple of heads"));
}

TEST_CASE("gpt: shapes, parameter names and count, every gradient", "[sequence_layers]") {
  const int64_t v = 7, t = 5, c = 4, blocks = 2, r = 2;
  auto net = zoo::gpt(v, t, c, 2, blocks, r);
  net.build({t}, 5);
  CHECK(net.size() == static_cast<std::size_t>(blocks + 4));
  CHECK(net.output_shape() == shape{t, v});
  // zoo::gpt_parameters counts without building: the same count.
  CHECK(static_cast<double>(net.num_parameters()) == zoo::gpt_parameters(v, t, c, blocks, r));
  const auto ps = net.parameters();
  CHECK(ps.front()->name == "0.embedding.weight");
  CHECK(ps[1]->name == "1.positional_embedding.weight");
  CHECK(ps[2]->name == "2.transformer_block.0.residual.0.layer_norm.gamma");
  CHECK(ps.back()->name == "5.sequence_dense.bias");
  net.parameters();
  CHECK(net.parameters()[2]->name == "2.transformer_block.0.residual.0.layer_norm.gamma");  // named once
  const tensor x = random_tokens(2, t, v, 11);
  std::vector<int32_t> targets;
  for (int64_t i = 0; i < x.numel(); ++i) targets.push_back((static_cast<int32_t>(x.at(i)) + 1) % v);
  const tensor& y = net.forward(ctx, x, true);
  CHECK(y.shape() == shape{2, t, v});
  // Embeddings of N(0, 0.02^2) make layer norm's input tiny: a step of 1e-2 would not be small.
  ps[0]->value.copy_from(testing::random_tensor(ps[0]->value.shape(), 1));
  ps[1]->value.copy_from(testing::random_tensor(ps[1]->value.shape(), 2));
  check_model_gradients(net, x, targets);
  for (auto* p : net.parameters()) CHECK(p->grad.shape() == p->value.shape());

  auto defaults = zoo::gpt(65);
  defaults.build({128});
  CHECK(static_cast<double>(defaults.num_parameters()) == zoo::gpt_parameters(65, 128, 128, 4, 4));
  auto no_blocks = zoo::gpt(v, t, c, 2, 0, r);
  no_blocks.build({t});
  CHECK(static_cast<double>(no_blocks.num_parameters()) == zoo::gpt_parameters(v, t, c, 0, r));
  auto shorter = zoo::gpt(v, t, c, 2, 1, r);
  shorter.build({t - 2});  // a shorter context uses the first rows of the position table
  CHECK(shorter.forward(ctx, random_tokens(1, t - 2, v, 1), false).shape() == shape{1, t - 2, v});
  CHECK_THROWS_WITH(zoo::gpt(v, t, c, 2, 1, r).build({t + 1}), Contains("positional_embedding #2 expects"));
  CHECK_THROWS_WITH(net.forward(ctx, tensor::full({1, t}, 9.0f), false), Contains("token id 9"));
}

TEST_CASE("gpt is causal: changing token t changes no output before t", "[sequence_layers]") {
  const int64_t v = 9, t = 6;
  auto net = zoo::gpt(v, t, 8, 2, 2, 2);
  net.build({t}, 2);
  const tensor x = random_tokens(2, t, v, 12);
  const tensor before = net.forward(ctx, x, false).clone();
  for (int64_t changed = 0; changed < t; ++changed) {
    tensor x2 = x.clone();
    x2.at(changed) = static_cast<float>((static_cast<int64_t>(x.at(changed)) + 1) % v);  // batch 0 only
    const tensor& after = net.forward(ctx, x2, false);
    const std::size_t row = static_cast<std::size_t>(v) * sizeof(float);
    INFO("token " << changed << " changed");
    // Batch 0: positions before `changed` keep every bit, the changed one moves; batch 1 keeps every bit.
    CHECK(std::memcmp(before.data(), after.data(), changed * row) == 0);
    CHECK(std::memcmp(before.data() + changed * v, after.data() + changed * v, row) != 0);
    CHECK(std::memcmp(before.data() + t * v, after.data() + t * v, t * row) == 0);
  }
}

TEST_CASE("gpt decodes a sequence in pieces: the rows of its forward pass, and back from an earlier position",
          "[sequence_layers]") {
  const int64_t v = 11, t = 10;
  auto net = zoo::gpt(v, t, 8, 2, 2, 2);
  net.build({t}, 4);
  REQUIRE(net.decodes());
  tensor x = random_tokens(1, t, v, 13);
  const tensor want = net.forward(ctx, x, false).clone();
  model::activations a = net.make_activations();
  // Largest |decoded - forward| over rows [start, start + n) of `want`.
  auto worst = [&](const tensor& got, const tensor& ref, int64_t start) {
    double w = 0;
    for (int64_t i = 0; i < got.numel(); ++i) w = std::max(w, std::abs(double(got.at(i)) - ref.at(start * v + i)));
    return w;
  };
  const int64_t pieces[][2] = {{0, 3}, {3, 1}, {4, 1}, {5, 5}};  // start, length
  for (const auto& p : pieces) {
    INFO("positions " << p[0] << " + " << p[1]);
    tensor piece = tensor::empty({1, p[1]});
    std::copy(x.data() + p[0], x.data() + p[0] + p[1], piece.data());
    const tensor& got = net.decode(ctx, piece, p[0], a);
    REQUIRE(got.shape() == shape{1, p[1], v});
    CHECK(worst(got, want, p[0]) < 1e-5);
  }
  // Back to position 6 with other tokens: the rows of the changed sequence's forward pass.
  for (int64_t i = 6; i < t; ++i) x.at(i) = static_cast<float>((static_cast<int64_t>(x.at(i)) + 3) % v);
  const tensor changed = net.forward(ctx, x, false).clone();
  tensor rest = tensor::empty({1, 4});
  std::copy(x.data() + 6, x.data() + t, rest.data());
  CHECK(worst(net.decode(ctx, rest, 6, a), changed, 6) < 1e-5);
  // What cannot be decoded is an error that says why.
  tensor one_token = tensor::zeros({1, 1});
  model::activations fresh = net.make_activations();
  CHECK_THROWS_WITH(net.decode(ctx, one_token, 2, fresh), Contains("holds the 0 positions before it"));
  CHECK_THROWS_AS(net.decode(ctx, rest, 7, a), shape_error);  // 7 + 4 positions > 10
  CHECK_THROWS_AS(net.decode(ctx, tensor::zeros({2, 1}), 0, a), shape_error);  // one sequence at a time
  // A user's sequence model with a residual block whose shortcut is a projection decodes too.
  auto own = sequential(embedding(v, 6), positional_embedding(t, 6),
                        residual(layer_norm(6), sequence_dense(6, 8), gelu()).projection(sequence_dense(6, 8)),
                        causal_self_attention(8, 2), sequence_dense(8, v));
  own.build({t}, 5);
  REQUIRE(own.decodes());
  const tensor own_want = own.forward(ctx, x, false).clone();
  model::activations oa = own.make_activations();
  tensor head = tensor::empty({1, 7}), tail = tensor::empty({1, 3});
  std::copy(x.data(), x.data() + 7, head.data());
  std::copy(x.data() + 7, x.data() + t, tail.data());
  CHECK(worst(own.decode(ctx, head, 0, oa), own_want, 0) < 1e-5);
  CHECK(worst(own.decode(ctx, tail, 7, oa), own_want, 7) < 1e-5);
  auto mlp = sequential(flatten(), dense(10, 4));
  mlp.build({10});
  CHECK_FALSE(mlp.decodes());
  model::activations ma = mlp.make_activations();
  CHECK_THROWS_WITH(mlp.decode(ctx, one_token, 0, ma), Contains("flatten #1 (flatten) does not decode"));
}

TEST_CASE("a tiny gpt learns a periodic text with AdamW", "[sequence_layers]") {
  const int64_t v = 5, t = 8, b = 4;
  auto net = zoo::gpt(v, t, 16, 2, 1, 2);
  net.build({t}, 1);
  tensor x = tensor::empty({b, t});
  std::vector<int32_t> targets;
  for (int64_t n = 0; n < b; ++n)
    for (int64_t i = 0; i < t; ++i) {
      x.at(n * t + i) = static_cast<float>((n + i) % v);
      targets.push_back(static_cast<int32_t>((n + i + 1) % v));
    }
  const auto ids = kernels::token_ids::of(targets, b);
  std::vector<tensor> m, s;
  for (auto* p : net.parameters()) {
    m.push_back(tensor::zeros(p->value.shape()));
    s.push_back(tensor::zeros(p->value.shape()));
  }
  float first = 0, last = 0;
  tensor dlogits;
  for (int64_t step = 1; step <= 40; ++step) {
    last = kernels::sequence_cross_entropy(ctx, net.forward(ctx, x, true), ids, &dlogits);
    if (step == 1) first = last;
    net.backward(ctx, dlogits);
    const auto ps = net.parameters();
    for (std::size_t i = 0; i < ps.size(); ++i)
      kernels::adamw_step(ctx, ps[i]->value, ps[i]->grad, m[i], s[i], 1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f, step);
  }
  CHECK(first > 1.0f);  // about ln(5) at the start
  CHECK(last < 0.2f * first);
}

TEST_CASE("gpt flattened and cut into stages computes what the whole model does", "[sequence_layers]") {
  const int64_t v = 6, t = 4;
  auto whole = zoo::gpt(v, t, 8, 2, 2, 2), head = zoo::gpt(v, t, 8, 2, 2, 2), tail = zoo::gpt(v, t, 8, 2, 2, 2);
  for (auto* m : {&whole, &head, &tail}) m->build({t}, 3);
  const auto flat = whole.flatten();  // parameters and gradients become views of two buffers
  const tensor x = random_tokens(2, t, v, 13);
  const tensor dy = testing::random_tensor({2, t, v}, 14);
  const tensor y = whole.forward(ctx, x, true).clone();
  whole.backward(ctx, dy);

  auto first = head.slice(0, 3), second = tail.slice(3, 6);
  CHECK(second.parameters().front()->name == "3.transformer_block.0.residual.0.layer_norm.gamma");
  const tensor& y2 = second.forward(ctx, first.forward(ctx, x, true), true);
  CHECK(y2.to_vector() == y.to_vector());
  const tensor dmid = second.backward(ctx, dy).clone();
  CHECK(dmid.shape() == shape{2, t, 8});
  first.backward(ctx, dmid);
  std::vector<float> grads;
  for (auto* m : {&first, &second})
    for (auto* p : m->parameters()) {
      const auto g = p->grad.to_vector();
      grads.insert(grads.end(), g.begin(), g.end());
    }
  CHECK(grads == flat.grads.to_vector());  // every gradient written in place, the same bits
}
