// Residual blocks and global average pooling in the DSL: gradients, shape
// errors that name the block and the layer inside it, parameter and buffer
// names, the flat layout, the zoo's ResNet-20.
#include <catch2/catch.hpp>

#include <set>

#include "kernels/kernels.hpp"
#include "model/nn.hpp"
#include "model/zoo.hpp"
#include "tests/gradcheck.hpp"

using namespace troupe;
using namespace troupe::nn;
using Catch::Contains;

namespace {
const kernels::context ctx = testing::test_context();

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

/// A small network of the zoo's shape: a block with the identity shortcut and one with a projection.
model::model small_resnet() {
  return sequential(conv2d(2, 4, 3).padding(1).bias(false), batch_norm(4), relu(),
                    residual(conv2d(4, 4, 3).padding(1), batch_norm(4), nn::tanh(), conv2d(4, 4, 3).padding(1)),
                    nn::tanh(),
                    residual(conv2d(4, 6, 3).stride(2).padding(1), batch_norm(6), nn::tanh(),
                             conv2d(6, 6, 3).padding(1), batch_norm(6))
                        .projection(conv2d(4, 6, 1).stride(2), batch_norm(6)),
                    nn::tanh(), global_avg_pool(), dense(6, 3));
}
} // namespace

TEST_CASE("residual blocks with identity and projection shortcuts match numerical gradients", "[model][grad]") {
  auto net = small_resnet();
  net.build({2, 6, 5}, 3);
  CHECK(net.output_shape() == shape{3});
  tensor x = testing::random_tensor({3, 2, 6, 5}, 5);
  check_model_gradients(net, x, {0, 2, 1});
}

TEST_CASE("a residual block passes the input gradient through both paths", "[model][grad]") {
  // A dense layer in front of the blocks makes them compute their input gradient.
  auto net = sequential(dense(4, 4), residual(dense(4, 4), nn::tanh(), dense(4, 4)), nn::tanh(),
                        residual(nn::tanh(), dense(4, 4)).projection(dense(4, 4)), dense(4, 3));
  net.build({4}, 2);
  tensor x = testing::random_tensor({5, 4}, 9);
  check_model_gradients(net, x, {0, 1, 2, 1, 0});
  // The first dense layer's weight gradient is only right when both blocks
  // return the sum of their body's and shortcut's input gradients.
  CHECK(net.parameters()[0]->name == "0.dense.weight");
}

TEST_CASE("a block that starts the model skips its input gradient, inside too", "[model][grad]") {
  auto net = sequential(residual(nn::tanh(), conv2d(1, 2, 3).padding(1), nn::sigmoid(), conv2d(2, 1, 3).padding(1)),
                        flatten(), dense(16, 2));
  net.build({1, 4, 4}, 4);
  CHECK(!net.at(0).needs_input_grad());
  auto inner = net.at(0).inner_layers();
  REQUIRE(inner.size() == 4);
  CHECK(inner[0].place == "1");
  CHECK(!inner[0].inner->needs_input_grad());  // tanh before the first conv
  CHECK(!inner[1].inner->needs_input_grad());  // the first conv
  CHECK(inner[2].inner->needs_input_grad());
  CHECK(inner[3].inner->needs_input_grad());
  tensor x = testing::random_tensor({2, 1, 4, 4}, 8);
  check_model_gradients(net, x, {1, 0});
}

TEST_CASE("global average pooling matches numerical gradients", "[kernels][grad]") {
  tensor x = testing::random_tensor({2, 3, 5, 4}, 71), y, dx;
  kernels::global_avg_pool2d_forward(ctx, x, y);
  REQUIRE(y.shape() == shape{2, 3});
  double s = 0;
  for (int i = 0; i < 20; ++i) s += x.at(20 + i);
  CHECK(y.at(1) == Approx(s / 20));
  tensor r = testing::random_tensor(y.shape(), 72);
  kernels::global_avg_pool2d_backward(ctx, r, x.shape(), dx);
  testing::check_gradient(x, dx, [&] { kernels::global_avg_pool2d_forward(ctx, x, y); return testing::dot(y, r); });
}

TEST_CASE("shape errors name the block and the layer inside it", "[model]") {
  auto wrong_inner = sequential(conv2d(1, 8, 3).padding(1), relu(),
                                residual(conv2d(8, 8, 3).padding(1), batch_norm(8), relu(), conv2d(16, 8, 3).padding(1)));
  CHECK_THROWS_AS(wrong_inner.build({1, 10, 10}), shape_error);
  CHECK_THROWS_WITH(wrong_inner.build({1, 10, 10}),
                    "residual #3: conv2d #4 inside expects 16 input channels, previous layer (relu #3 inside) "
                    "gives 8 (shape [8, 10, 10])");

  auto wrong_first = sequential(conv2d(1, 8, 3), residual(conv2d(4, 8, 3).padding(1)));
  CHECK_THROWS_WITH(wrong_first.build({1, 10, 10}),
                    Contains("residual #2: conv2d #1 inside expects 4 input channels, previous layer (conv2d #1) gives 8"));

  auto no_projection = sequential(residual(conv2d(4, 8, 3).stride(2).padding(1)));
  CHECK_THROWS_WITH(no_projection.build({4, 10, 10}),
                    "residual #1: the body gives [8, 5, 5] but the shortcut gives the identity shortcut's "
                    "[4, 10, 10]: give the block a projection(...) that makes [8, 5, 5] of it");

  auto wrong_projection = sequential(residual(conv2d(4, 8, 3).stride(2).padding(1)).projection(conv2d(4, 8, 1)));
  CHECK_THROWS_WITH(wrong_projection.build({4, 10, 10}),
                    "residual #1: the body gives [8, 5, 5] but the shortcut gives [8, 10, 10] (its projection)");

  auto projection_input = sequential(residual(conv2d(4, 8, 1)).projection(conv2d(3, 8, 1)));
  CHECK_THROWS_WITH(projection_input.build({4, 10, 10}),
                    Contains("residual #1: conv2d #1 of the projection expects 3 input channels, the model input gives 4"));

  auto nested = sequential(relu(), residual(relu(), residual(conv2d(2, 3, 1))));
  CHECK_THROWS_WITH(nested.build({2, 4, 4}), Contains("residual #2: residual #2 inside: the body gives [3, 4, 4]"));

  CHECK_THROWS_WITH(sequential(global_avg_pool()).build({10}),
                    "global_avg_pool #1 expects [channels, height, width] inputs, the model input gives [10]");
}

TEST_CASE("blocks name their parameters and buffers after the block and the layer inside", "[model]") {
  auto net = small_resnet();
  net.build({2, 8, 8}, 1);
  std::vector<std::string> names;
  for (auto* p : net.parameters()) names.push_back(p->name);
  const std::vector<std::string> expected{
      "0.conv2d.weight",
      "1.batch_norm.gamma",
      "1.batch_norm.beta",
      "3.residual.0.conv2d.weight",
      "3.residual.0.conv2d.bias",
      "3.residual.1.batch_norm.gamma",
      "3.residual.1.batch_norm.beta",
      "3.residual.3.conv2d.weight",
      "3.residual.3.conv2d.bias",
      "5.residual.0.conv2d.weight",
      "5.residual.0.conv2d.bias",
      "5.residual.1.batch_norm.gamma",
      "5.residual.1.batch_norm.beta",
      "5.residual.3.conv2d.weight",
      "5.residual.3.conv2d.bias",
      "5.residual.4.batch_norm.gamma",
      "5.residual.4.batch_norm.beta",
      "5.residual.projection.0.conv2d.weight",
      "5.residual.projection.0.conv2d.bias",
      "5.residual.projection.1.batch_norm.gamma",
      "5.residual.projection.1.batch_norm.beta",
      "8.dense.weight",
      "8.dense.bias"};
  CHECK(names == expected);
  // Stable: asking again, building again, and the layout agree.
  net.build({2, 8, 8}, 2);
  std::vector<std::string> again;
  for (auto* p : net.parameters()) again.push_back(p->name);
  CHECK(again == expected);
  model::param_layout l = net.layout();
  REQUIRE(l.size() == expected.size());
  for (std::size_t i = 0; i < l.size(); ++i) CHECK(l[i].name == expected[i]);

  std::set<std::string> state;
  for (auto& e : net.state()) state.insert(e.name);
  for (const char* b : {"1.batch_norm.running_mean", "3.residual.1.batch_norm.running_var",
                        "5.residual.4.batch_norm.running_mean", "5.residual.projection.1.batch_norm.running_var"})
    CHECK(state.count(b) == 1);
  CHECK(state.size() == expected.size() + 2 * 5);

  CHECK_THAT(net.architecture(), Contains("residual(conv2d(4 -> 6, 3x3, stride 2, pad 1), batch_norm(6), tanh, "
                                          "conv2d(6 -> 6, 3x3, pad 1), batch_norm(6); projection conv2d(4 -> 6, "
                                          "1x1, stride 2), batch_norm(6))"));
  const std::string s = net.summary();
  CHECK_THAT(s, Contains("residual") && Contains("  projection 1: conv2d(4 -> 6, 1x1, stride 2)") &&
                    Contains("  4: conv2d(6 -> 6, 3x3, pad 1)"));
}

TEST_CASE("a model with blocks flattens into one buffer and loads its state", "[model]") {
  auto net = small_resnet();
  net.build({2, 8, 8}, 1);
  std::vector<std::vector<float>> before;
  for (auto* p : net.parameters()) before.push_back(p->value.to_vector());
  tensor x = testing::random_tensor({2, 2, 8, 8}, 3);
  const std::vector<float> y0 = net.forward(ctx, x, false).to_vector();

  model::model::flat_buffers flat = net.flatten();
  CHECK(flat.values.numel() == net.num_parameters());
  auto ps = net.parameters();
  for (std::size_t i = 0; i < ps.size(); ++i) {
    CHECK(ps[i]->value.shares_storage(flat.values));
    CHECK(ps[i]->value.to_vector() == before[i]);
  }
  CHECK(net.forward(ctx, x, false).to_vector() == y0);
  // Backward writes the gradients into the flat buffer.
  tensor d;
  kernels::softmax_cross_entropy(ctx, net.forward(ctx, x, true), {0, 1}, &d);
  net.backward(ctx, d);
  double norm = 0;
  for (float g : flat.grads.to_vector()) norm += double(g) * g;
  CHECK(norm > 0);

  auto other = small_resnet();
  other.build({2, 8, 8}, 9);
  other.load_state(net.architecture(), net.state());
  CHECK(other.forward(ctx, x, false).to_vector() == net.forward(ctx, x, false).to_vector());
}

TEST_CASE("the zoo's ResNet-20 for Fashion-MNIST and CIFAR-10", "[model]") {
  auto fm = zoo::resnet();
  fm.build({1, 28, 28});
  CHECK(fm.output_shape() == shape{10});
  // stem 144 + 32; stage 1: 3 x 4672; stage 2: 14528 + 2 x 18560; stage 3: 57728 + 2 x 73984; dense 650
  CHECK(fm.num_parameters() == 272186);
  CHECK(fm.size() == 23);  // conv, batch norm, relu, 9 x (block, relu), pool, dense
  auto cifar = zoo::resnet(3);
  cifar.build({3, 32, 32});
  CHECK(cifar.num_parameters() == 272186 + 2 * 16 * 9);
  CHECK(zoo::by_name("resnet").build({1, 28, 28}).num_parameters() == 272186);
  CHECK_THAT(fm.summary(), Contains("global_avg_pool") && Contains("[64, 7, 7]"));
  CHECK(fm.parameters()[3]->name == "3.residual.0.conv2d.weight");

  tensor x = testing::random_tensor({2, 3, 32, 32}, 4);
  CHECK(cifar.forward(ctx, x, true).shape() == shape{2, 10});
}

TEST_CASE("a batch norm whose output the next convolution reads through its map trains as one that writes it",
          "[model][grad]") {
  // In the first block the body's batch norm and ReLU are read by the convolution after them (deferred); in
  // the reference a dropout(0) between them keeps the output written. Both: the same logits (training and
  // inference), losses, gradients and running statistics over steps; and the deferring net's gradients
  // match numerical ones, on Winograd's path (the zoo's) and the direct one.
  for (kernels::conv_path path : {kernels::conv_path::winograd, kernels::conv_path::direct}) {
    kernels::context c = ctx;
    c.conv = path;
    auto make = [](bool written) {
      auto body = written ? residual(conv2d(8, 8, 3).padding(1).bias(false), batch_norm(8), relu(), dropout(0.0f),
                                     conv2d(8, 8, 3).padding(1).bias(false), batch_norm(8))
                          : residual(conv2d(8, 8, 3).padding(1).bias(false), batch_norm(8), relu(),
                                     conv2d(8, 8, 3).padding(1).bias(false), batch_norm(8));
      return sequential(conv2d(1, 8, 3).padding(1).bias(false), batch_norm(8), relu(), body, relu(),
                        global_avg_pool(), dense(8, 3));
    };
    auto deferred = make(false), written = make(true);
    deferred.build({1, 6, 6}, 4);
    written.build({1, 6, 6}, 4);
    {  // the same weights (the dropout moves the body's names, and with them the draws)
      const auto pa = deferred.parameters(), pb = written.parameters();
      REQUIRE(pa.size() == pb.size());
      for (std::size_t i = 0; i < pa.size(); ++i) pb[i]->value.copy_from(pa[i]->value);
    }
    const tensor x = testing::random_tensor({4, 1, 6, 6}, 61);
    const std::vector<int32_t> labels{0, 1, 2, 1};
    for (int step = 0; step < 3; ++step) {
      INFO("path " << (path == kernels::conv_path::winograd ? "winograd" : "direct") << " step " << step);
      tensor da, db;
      const float la = kernels::softmax_cross_entropy(c, deferred.forward(c, x, true), labels, &da);
      const float lb = kernels::softmax_cross_entropy(c, written.forward(c, x, true), labels, &db);
      CHECK(la == Approx(lb).epsilon(1e-6));
      deferred.backward(c, da);
      written.backward(c, db);
      const auto pa = deferred.parameters(), pb = written.parameters();
      REQUIRE(pa.size() == pb.size());
      for (std::size_t i = 0; i < pa.size(); ++i) {
        INFO(pa[i]->name);
        CHECK(testing::max_rel_diff(pa[i]->grad, pb[i]->grad) < 1e-4);
        // One plain SGD step on both, so that the next step starts from moved weights.
        for (int64_t j = 0; j < pa[i]->value.numel(); ++j) {
          pa[i]->value.data()[j] -= 0.1f * pa[i]->grad.at(j);
          pb[i]->value.data()[j] -= 0.1f * pb[i]->grad.at(j);
        }
      }
      CHECK(testing::max_rel_diff(deferred.forward(c, x, false), written.forward(c, x, false)) < 1e-5);
    }
    const auto ba = deferred.state(), bb = written.state();  // parameters and running statistics
    REQUIRE(ba.size() == bb.size());
    for (std::size_t i = 0; i < ba.size(); ++i) CHECK(testing::max_rel_diff(ba[i].value, bb[i].value) < 1e-5);
  }
  auto net = sequential(conv2d(1, 8, 3).padding(1).bias(false), batch_norm(8), relu(),
                        residual(conv2d(8, 8, 3).padding(1), batch_norm(8), relu(), conv2d(8, 8, 3).padding(1),
                                 batch_norm(8)),
                        relu(), global_avg_pool(), dense(8, 3));
  net.build({1, 5, 5}, 6);
  check_model_gradients(net, testing::random_tensor({3, 1, 5, 5}, 62), {2, 0, 1});
}
