// model::build fuses a ReLU into the convolution, batch norm or residual
// block before it: the same outputs and gradients as the unfused chain.
#include <catch2/catch.hpp>

#include "kernels/kernels.hpp"
#include "model/nn.hpp"
#include "tests/gradcheck.hpp"

using namespace troupe;
using namespace troupe::nn;

namespace {

const kernels::context ctx = testing::test_context();

/// A chain where each ReLU follows a layer that can apply it, and one where
/// dropout(0) (the identity) stands between them, so that nothing is fused
/// (nor the first block's sum into its last batch norm).
template <class Sep>
model::model net(const Sep& sep) {
  return sequential(conv2d(2, 6, 3).padding(1), sep, relu(), batch_norm(6), sep, relu(),
                    residual(conv2d(6, 6, 3).padding(1).bias(false), batch_norm(6), sep, relu(),
                             conv2d(6, 6, 3).padding(1).bias(false), batch_norm(6), sep),
                    sep, relu(),
                    residual(conv2d(6, 8, 3).stride(2).padding(1), sep, relu())
                        .projection(conv2d(6, 8, 1).stride(2), batch_norm(8)),
                    sep, relu(), global_avg_pool(), dense(8, 3), sep, relu());
}

} // namespace

TEST_CASE("fused ReLUs give the unfused chain's outputs and gradients", "[model]") {
  auto fused = sequential(conv2d(2, 6, 3).padding(1), relu(), batch_norm(6), relu(),
                          residual(conv2d(6, 6, 3).padding(1).bias(false), batch_norm(6), relu(),
                                   conv2d(6, 6, 3).padding(1).bias(false), batch_norm(6)),
                          relu(),
                          residual(conv2d(6, 8, 3).stride(2).padding(1), relu())
                              .projection(conv2d(6, 8, 1).stride(2), batch_norm(8)),
                          relu(), global_avg_pool(), dense(8, 3), relu());
  auto plain = net(dropout(0.0f));
  fused.build({2, 7, 6}, 1);
  plain.build({2, 7, 6}, 1);
  auto pf = fused.parameters(), pp = plain.parameters();
  REQUIRE(pf.size() == pp.size());
  for (std::size_t i = 0; i < pf.size(); ++i) pp[i]->value.copy_from(pf[i]->value);

  tensor x = testing::random_tensor({4, 2, 7, 6}, 3);
  // A fused ReLU hands on its input: the convolution's output, already rectified.
  const tensor& conv_out = fused.at(0).forward(ctx, x, true);
  CHECK(&fused.at(1).forward(ctx, conv_out, true) == &conv_out);
  const tensor& plain_out = plain.at(0).forward(ctx, x, true);
  CHECK(&plain.at(2).forward(ctx, plain.at(1).forward(ctx, plain_out, true), true) != &plain_out);
  for (bool training : {true, false}) {
    const std::vector<float> a = fused.forward(ctx, x, training).to_vector();
    const std::vector<float> b = plain.forward(ctx, x, training).to_vector();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == Approx(b[i]).margin(1e-6));
  }
  tensor dy = testing::random_tensor({4, 3}, 4);
  fused.forward(ctx, x, true);
  fused.backward(ctx, dy);
  plain.forward(ctx, x, true);
  plain.backward(ctx, dy);
  for (std::size_t i = 0; i < pf.size(); ++i) {
    INFO(pf[i]->name);
    for (int64_t j = 0; j < pf[i]->grad.numel(); ++j)
      CHECK(pf[i]->grad.at(j) == Approx(pp[i]->grad.at(j)).margin(1e-5));
  }
  // Fusion does not show in the architecture: checkpoints of both load into each other's kind.
  CHECK(fused.architecture() == sequential(conv2d(2, 6, 3).padding(1), relu(), batch_norm(6), relu(),
                                           residual(conv2d(6, 6, 3).padding(1).bias(false), batch_norm(6), relu(),
                                                    conv2d(6, 6, 3).padding(1).bias(false), batch_norm(6)),
                                           relu(),
                                           residual(conv2d(6, 8, 3).stride(2).padding(1), relu())
                                               .projection(conv2d(6, 8, 1).stride(2), batch_norm(8)),
                                           relu(), global_avg_pool(), dense(8, 3), relu())
                                    .build({2, 7, 6}, 2)
                                    .architecture());
}

TEST_CASE("a cut between a convolution and its ReLU gives the whole chain's outputs and gradients", "[model]") {
  auto make = [] {
    auto m = sequential(conv2d(2, 4, 3).padding(1), relu(), flatten(), dense(4 * 5 * 5, 3));
    m.build({2, 5, 5}, 7);
    return m;
  };
  auto whole = make();
  auto cut0 = make(), cut1 = make();  // a slice takes its layers out of the model
  auto first = cut0.slice(0, 1);      // the convolution alone: it must not apply the next stage's ReLU
  auto second = cut1.slice(1, 4);     // the ReLU first: it must rectify
  tensor x = testing::random_tensor({3, 2, 5, 5}, 5);
  const tensor& h = first.forward(ctx, x, true);
  bool negative = false;
  for (int64_t i = 0; i < h.numel(); ++i) negative = negative || h.at(i) < 0;
  CHECK(negative);
  const std::vector<float> a = second.forward(ctx, h, true).to_vector();
  const std::vector<float> b = whole.forward(ctx, x, true).to_vector();
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == Approx(b[i]).margin(1e-6));
  tensor dy = testing::random_tensor({3, 3}, 6);
  first.backward(ctx, second.backward(ctx, dy));
  whole.backward(ctx, dy);
  auto pw = whole.parameters(), p1 = first.parameters(), p2 = second.parameters();
  p1.insert(p1.end(), p2.begin(), p2.end());
  REQUIRE(pw.size() == p1.size());
  for (std::size_t i = 0; i < pw.size(); ++i) {
    INFO(pw[i]->name);
    CHECK(pw[i]->name == p1[i]->name);
    for (int64_t j = 0; j < pw[i]->grad.numel(); ++j)
      CHECK(pw[i]->grad.at(j) == Approx(p1[i]->grad.at(j)).margin(1e-5));
  }
}

TEST_CASE("a convolution applies the ReLU and the 2x2 max pool after it and gives the unfused chain's results", "[model]") {
  // conv -> relu -> max_pool2d(2) twice (the reference CNN's blocks, smaller); dropout(0) between them in
  // `plain` keeps anything from fusing.
  auto make = [](bool fuse) {
    auto m = fuse ? sequential(conv2d(1, 8, 3).padding(1), relu(), max_pool2d(2), conv2d(8, 16, 3).padding(1),
                               relu(), max_pool2d(2), flatten(), dense(16 * 2 * 3, 5))
                  : sequential(conv2d(1, 8, 3).padding(1), dropout(0.0f), relu(), dropout(0.0f), max_pool2d(2),
                               conv2d(8, 16, 3).padding(1), dropout(0.0f), relu(), dropout(0.0f), max_pool2d(2),
                               flatten(), dense(16 * 2 * 3, 5));
    m.build({1, 9, 13}, 3);
    return m;
  };
  // The direct and Winograd kernels, and im2col, where the convolution runs the three kernels itself.
  for (kernels::conv_path path : {kernels::conv_path::automatic, kernels::conv_path::im2col}) {
    kernels::context c = ctx;
    c.conv = path;
    INFO("path " << (path == kernels::conv_path::im2col ? "im2col" : "automatic"));
    auto fused = make(true), plain = make(false);
    auto pf = fused.parameters(), pp = plain.parameters();
    REQUIRE(pf.size() == pp.size());
    for (std::size_t i = 0; i < pf.size(); ++i) pp[i]->value.copy_from(pf[i]->value);
    tensor x = testing::random_tensor({3, 1, 9, 13}, 8);
    // The convolution hands on the pool's output; the ReLU and the pool hand on their input.
    const tensor& h = fused.at(0).forward(c, x, true);
    CHECK(h.shape() == shape{3, 8, 4, 6});
    CHECK(&fused.at(2).forward(c, fused.at(1).forward(c, h, true), true) == &h);
    const std::vector<float> a = fused.forward(c, x, true).to_vector();
    const std::vector<float> b = plain.forward(c, x, true).to_vector();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == Approx(b[i]).margin(1e-6));
    tensor dy = testing::random_tensor({3, 5}, 9);
    fused.backward(c, dy);
    plain.backward(c, dy);
    for (std::size_t i = 0; i < pf.size(); ++i) {
      INFO(pf[i]->name);
      for (int64_t j = 0; j < pf[i]->grad.numel(); ++j)
        CHECK(pf[i]->grad.at(j) == Approx(pp[i]->grad.at(j)).margin(1e-5));
    }
  }
  // Not fused: a pool of another window, a pool without the ReLU, a cut between the ReLU and the pool.
  auto other = sequential(conv2d(1, 4, 3).padding(1), relu(), max_pool2d(3), flatten());
  other.build({1, 9, 9}, 1);
  tensor x = testing::random_tensor({2, 1, 9, 9}, 10);
  CHECK(other.at(0).forward(ctx, x, true).shape() == shape{2, 4, 9, 9});
  auto no_relu = sequential(conv2d(1, 4, 3).padding(1), max_pool2d(2), flatten());
  no_relu.build({1, 9, 9}, 1);
  CHECK(no_relu.at(0).forward(ctx, x, true).shape() == shape{2, 4, 9, 9});
  auto make_small = [] {
    auto m = sequential(conv2d(1, 4, 3).padding(1), relu(), max_pool2d(2), flatten());
    m.build({1, 9, 9}, 1);
    return m;
  };
  auto whole = make_small(), cut0 = make_small(), cut1 = make_small();  // a slice takes its layers out
  auto first = cut0.slice(0, 2), second = cut1.slice(2, 4);             // the pool starts the second stage
  const tensor& mid = first.forward(ctx, x, true);
  CHECK(mid.shape() == shape{2, 4, 9, 9});
  const std::vector<float> a = second.forward(ctx, mid, true).to_vector();
  const std::vector<float> b = whole.forward(ctx, x, true).to_vector();
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == Approx(b[i]).margin(1e-6));
}
