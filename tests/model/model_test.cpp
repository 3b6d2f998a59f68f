#include <catch2/catch.hpp>

#include <cstring>

#include "kernels/kernels.hpp"
#include "model/init.hpp"
#include "model/nn.hpp"
#include "model/optimizer.hpp"
#include "model/zoo.hpp"
#include "tests/gradcheck.hpp"

using namespace troupe;
using namespace troupe::nn;
using Catch::Contains;

namespace {
const kernels::context ctx = testing::test_context();

/// Every parameter's gradient from backward() against central differences of the loss.
void check_model_gradients(model::model& net, const tensor& x, const std::vector<int32_t>& labels) {
  tensor dlogits;
  kernels::softmax_cross_entropy(ctx, net.forward(ctx, x, true), labels, &dlogits);
  net.backward(ctx, dlogits);
  auto loss = [&] { return kernels::softmax_cross_entropy(ctx, net.forward(ctx, x, true), labels, nullptr); };
  for (auto* p : net.parameters()) {
    INFO("parameter " << p->name);
    tensor g = p->grad.clone();
    testing::check_gradient(p->value, g, loss, 1e-2, 3e-2);
  }
}
} // namespace

TEST_CASE("shape inference names the layer that does not fit", "[model]") {
  auto net = sequential(conv2d(1, 32, 3).padding(1), relu(), max_pool2d(2), conv2d(32, 64, 3).padding(1), relu(),
                        max_pool2d(2), flatten(), dense(3000, 128));
  CHECK_THROWS_AS(net.build({1, 28, 28}), shape_error);
  CHECK_THROWS_WITH(net.build({1, 28, 28}), "dense #8 expects 3000 inputs, previous layer (flatten #7) gives 3136");

  auto conv = sequential(conv2d(3, 8, 3));
  CHECK_THROWS_WITH(conv.build({1, 28, 28}), Contains("conv2d #1 expects 3 input channels, the model input gives 1"));
  auto noflat = sequential(conv2d(1, 4, 3), dense(100, 10));
  CHECK_THROWS_WITH(noflat.build({1, 12, 12}), Contains("add flatten()"));
  auto pool = sequential(max_pool2d(5));
  CHECK_THROWS_WITH(pool.build({1, 3, 3}), Contains("max_pool2d #1"));
  CHECK_THROWS_WITH(sequential(relu()).forward(ctx, tensor::zeros({1, 1}), false), Contains("build"));
}

TEST_CASE("invalid layer options are rejected when the model is made", "[model]") {
  CHECK_THROWS_WITH(sequential(dense(0, 3)), Contains("positive"));
  CHECK_THROWS_WITH(sequential(conv2d(1, 2, 3).stride(0)), Contains("positive"));
  CHECK_THROWS_WITH(sequential(dropout(1.5f)), Contains("[0, 1)"));
  CHECK_THROWS_WITH(optim::sgd(-1).make(), Contains("learning rate"));
  CHECK_THROWS_WITH(optim::sgd(0.1f).momentum(1.0f).make(), Contains("momentum"));
}

TEST_CASE("the reference models: summary, parameter names and counts", "[model]") {
  auto cnn = zoo::cnn();
  cnn.build({1, 28, 28});
  CHECK(cnn.output_shape() == shape{10});
  // 320 + 18496 + 401536 + 1290
  CHECK(cnn.num_parameters() == 421642);
  std::string s = cnn.summary();
  CHECK_THAT(s, Contains("conv2d(1 -> 32, 3x3, pad 1)") && Contains("[64, 7, 7]") && Contains("421642"));
  auto params = cnn.parameters();
  REQUIRE(params.size() == 8);
  CHECK(params[0]->name == "0.conv2d.weight");
  CHECK(params[7]->name == "9.dense.bias");
  auto mlp = zoo::mlp();
  mlp.build({1, 28, 28});
  CHECK(mlp.num_parameters() == 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  CHECK_THROWS_WITH(zoo::by_name("vgg"), Contains("unknown model 'vgg': choose mlp, cnn or resnet"));
}

TEST_CASE("seeded initialisation is reproducible and follows the scheme", "[model]") {
  auto a = sequential(dense(400, 300)), b = sequential(dense(400, 300)), c = sequential(dense(400, 300));
  a.build({400}, 7);
  b.build({400}, 7);
  c.build({400}, 8);
  auto wa = a.parameters()[0]->value, wb = b.parameters()[0]->value, wc = c.parameters()[0]->value;
  CHECK(wa.to_vector() == wb.to_vector());
  CHECK(wa.to_vector() != wc.to_vector());
  double s2 = 0;
  for (float v : wa.to_vector()) s2 += double(v) * v;
  double sd = std::sqrt(s2 / wa.numel());
  CHECK(sd == Approx(std::sqrt(2.0 / 400)).epsilon(0.03));  // He: std = sqrt(2 / fan_in)
  CHECK(a.parameters()[1]->value.to_vector() == std::vector<float>(300, 0.0f));

  auto x = sequential(dense(400, 300).init(init_scheme::xavier));
  x.build({400}, 1);
  float lim = std::sqrt(6.0f / 700.0f), mx = 0;
  for (float v : x.parameters()[0]->value.to_vector()) mx = std::max(mx, std::abs(v));
  CHECK(mx <= lim);
  CHECK(mx > 0.9f * lim);
}

TEST_CASE("whole-model backward matches numerical gradients", "[model][grad]") {
  auto net = sequential(conv2d(2, 3, 3).padding(1), batch_norm(3), nn::tanh(), avg_pool2d(2), conv2d(3, 4, 2).stride(2),
                        sigmoid(), flatten(), dense(4, 5), relu(), dropout(0.0f), dense(5, 3));
  net.build({2, 4, 4}, 3);
  tensor x = testing::random_tensor({3, 2, 4, 4}, 5);
  std::vector<int32_t> labels{0, 2, 1};
  check_model_gradients(net, x, labels);
}

TEST_CASE("layers before the first learning layer skip their input gradient, gradients stay right", "[model][grad]") {
  // As the reference MLP: flatten first, so the first dense layer needs no input gradient.
  auto net = sequential(flatten(), nn::tanh(), dense(8, 5), relu(), dense(5, 3));
  net.build({2, 2, 2}, 4);
  const std::vector<bool> expected{false, false, false, true, true};
  for (std::size_t i = 0; i < expected.size(); ++i) {
    INFO("layer " << i);
    CHECK(net.at(i).needs_input_grad() == expected[i]);
  }
  tensor x = testing::random_tensor({3, 2, 2, 2}, 6);
  std::vector<int32_t> labels{2, 0, 1};
  check_model_gradients(net, x, labels);
}

namespace {
/// Every parameter's gradient from backward(dout), then from backward_part one part at a time (last
/// layer, last part first), of the same forward: the same bits. Returns the parts run.
std::size_t check_parts(model::model& net, const tensor& x, const tensor& dout) {
  net.forward(ctx, x, true);
  net.backward(ctx, dout);
  std::vector<std::vector<float>> whole;
  for (auto* p : net.parameters()) whole.push_back(p->grad.to_vector());
  net.forward(ctx, x, true);
  const tensor* g = &dout;
  std::size_t parts = 0;
  for (std::size_t i = net.size(); i-- > 0;) {
    for (std::size_t p = net.layer_backward_parts(i); p-- > 0 && g->defined();) {
      g = &net.backward_part(ctx, *g, i, p);
      ++parts;
    }
    CHECK(g->defined() == net.layer_needs_input_grad(i));
    if (!net.layer_needs_input_grad(i)) break;
  }
  const auto params = net.parameters();
  for (std::size_t k = 0; k < params.size(); ++k) {
    INFO("parameter " << params[k]->name);
    CHECK(params[k]->grad.to_vector() == whole[k]);
  }
  return parts;
}
} // namespace

TEST_CASE("backward one part at a time gives backward()'s bits", "[model][grad]") {
  auto net = sequential(conv2d(2, 3, 3).padding(1), batch_norm(3), relu(), max_pool2d(2), flatten(), dense(12, 5),
                        relu(), dense(5, 3));
  net.build({2, 4, 4}, 3);
  CHECK(check_parts(net, testing::random_tensor({3, 2, 4, 4}, 5), testing::random_tensor({3, 3}, 6)) == 8);
  // A transformer block's backward is its two parts: attention, MLP.
  model::model gpt = zoo::gpt(11, 6, 8, 2, 2, 2);
  gpt.build({6}, 1);
  CHECK(gpt.layer_backward_parts(2) == 2);
  std::vector<float> ids(2 * 6);
  for (std::size_t k = 0; k < ids.size(); ++k) ids[k] = static_cast<float>((k * 7) % 11);
  const std::size_t parts = check_parts(gpt, tensor::from({2, 6}, ids), testing::random_tensor({2, 6, 11}, 8));
  CHECK(parts == gpt.size() + 2);  // embedding, position, 2 blocks of 2 parts, norm, head
  CHECK_THROWS_WITH(gpt.backward_part(ctx, tensor(), 2, 2), Contains("backward_part: part 2 of layer 2"));
}

TEST_CASE("dropout is identity at evaluation and scales kept units in training", "[model]") {
  auto net = sequential(dropout(0.5f));
  net.build({1000}, 1);
  tensor x = tensor::full({1, 1000}, 1.0f);
  CHECK(net.forward(ctx, x, false).to_vector() == x.to_vector());
  auto y = net.forward(ctx, x, true).to_vector();
  int kept = 0;
  for (float v : y) {
    CHECK((v == 0.0f || v == 2.0f));
    kept += v != 0.0f;
  }
  CHECK(kept > 400);
  CHECK(kept < 600);
}

TEST_CASE("SGD with momentum drives a small model's loss down", "[model]") {
  auto net = sequential(flatten(), dense(4, 16), relu(), dense(16, 2));
  net.build({1, 2, 2}, 1);
  auto opt = optim::sgd(0.1f).momentum(0.9f).make();
  // Label = whether the first pixel exceeds the last.
  tensor x = testing::random_tensor({32, 1, 2, 2}, 3);
  std::vector<int32_t> y(32);
  for (int i = 0; i < 32; ++i) y[i] = x.at(i * 4) > x.at(i * 4 + 3);
  tensor d;
  float first = 0, last = 0;
  for (int step = 0; step < 100; ++step) {
    float l = kernels::softmax_cross_entropy(ctx, net.forward(ctx, x, true), y, &d);
    if (step == 0) first = l;
    last = l;
    net.backward(ctx, d);
    opt->step(ctx, net.parameters());
  }
  CHECK(last < 0.5f * first);
  CHECK(kernels::count_correct(ctx, net.forward(ctx, x, false), y) >= 30);
}

TEST_CASE("a model built without initial draws loads a state and runs as the model it came from, dropout too",
          "[model]") {
  auto make = [] {
    return sequential(conv2d(1, 3, 3).padding(1), relu(), flatten(), dense(3 * 4 * 4, 8), dropout(0.5f),
                      dense(8, 4));
  };
  model::model from = make();
  from.build({1, 4, 4}, 7);
  model::model loaded = make();
  {
    model::no_initial_draws values_from_the_checkpoint;
    loaded.build({1, 4, 4}, 7);
  }
  loaded.load_state(from.architecture(), from.state());
  const tensor x = testing::random_tensor({5, 1, 4, 4}, 3);
  // Training mode: the dropout masks come from a seed drawn after the weights, the same both ways.
  const tensor want = from.forward(ctx, x, true).clone();
  const tensor& got = loaded.forward(ctx, x, true);
  REQUIRE(got.shape() == want.shape());
  CHECK(std::memcmp(got.data(), want.data(), want.numel() * sizeof(float)) == 0);
  // And the guard ends with its scope: a model built after it draws its values again.
  model::model again = make();
  again.build({1, 4, 4}, 7);
  const auto a = again.state(), f = from.state();
  for (std::size_t i = 0; i < f.size(); ++i)
    CHECK(std::memcmp(a[i].value.data(), f[i].value.data(), f[i].value.numel() * sizeof(float)) == 0);
}
