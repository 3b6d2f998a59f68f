// conv2d's direct and Winograd kernels (and the automatic choice between
// them) against the im2col + GEMM reference on random shapes: odd sizes,
// strides 1 to 3, padding 0 to 2, kernels 1 to 7, channel counts around the
// vector width. Same results up to float rounding.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <utility>

#include "kernels/cpu/conv_internal.hpp"
#include "kernels/kernels.hpp"
#include "kernels/machine.hpp"
#include "tests/gradcheck.hpp"

using namespace troupe;
namespace k = troupe::kernels;

namespace {

using testing::max_rel_diff;

struct conv_case {
  int64_t n, c, oc, k, s, p, h, w;
  bool bias, dx;
  std::string describe() const {
    std::ostringstream os;
    os << "n " << n << " c " << c << " oc " << oc << " k " << k << " s " << s << " p " << p << " h " << h << " w "
       << w << (bias ? " bias" : "") << (dx ? " dx" : "");
    return os.str();
  }
};

const char* name(k::conv_path p) {
  switch (p) {
    case k::conv_path::automatic: return "automatic";
    case k::conv_path::direct: return "direct";
    case k::conv_path::winograd: return "winograd";
    default: return "im2col";
  }
}

/// `path` against im2col on one shape.
void compare_path(const conv_case& t, uint64_t seed, k::conv_path path) {
  INFO(t.describe() << ", path " << name(path));
  k::conv2d_geometry g{t.c, t.oc, t.k, t.s, t.p};
  tensor x = testing::random_tensor({t.n, t.c, t.h, t.w}, seed), w = testing::random_tensor({t.oc, t.c, t.k, t.k}, seed + 1);
  tensor b = t.bias ? testing::random_tensor({t.oc}, seed + 2) : tensor();
  k::context direct = testing::test_context(), reference = direct;
  direct.conv = path;
  reference.conv = k::conv_path::im2col;

  tensor y1, y2, cols1, cols2;
  k::conv2d_forward(direct, x, w, b, g, y1, cols1);
  k::conv2d_forward(reference, x, w, b, g, y2, cols2);
  CHECK(max_rel_diff(y1, y2) < 1e-5);

  tensor dy = testing::random_tensor(y2.shape(), seed + 3);
  tensor dx1, dx2, dw1, dw2, db1, db2;
  k::conv2d_backward(direct, x, w, cols1, dy, g, t.dx ? &dx1 : nullptr, dw1, t.bias ? &db1 : nullptr);
  k::conv2d_backward(reference, x, w, cols2, dy, g, t.dx ? &dx2 : nullptr, dw2, t.bias ? &db2 : nullptr);
  CHECK(max_rel_diff(dw1, dw2) < 1e-5);
  if (t.dx) CHECK(max_rel_diff(dx1, dx2) < 1e-5);
  if (t.bias) CHECK(max_rel_diff(db1, db2) < 1e-5);
  if (!t.dx) return;
  // With an addend (a residual block's sum of gradients), in the pass that writes dx: add()'s bits, each path.
  const tensor addend = testing::random_tensor(x.shape(), seed + 4);
  for (const auto& [ctx, cols, dx] : {std::tie(direct, cols1, dx1), std::tie(reference, cols2, dx2)}) {
    tensor summed, expect, dw3;
    k::add(ctx, dx, addend, expect);
    k::conv2d_backward(ctx, x, w, cols, dy, g, &summed, dw3, nullptr, nullptr, &addend);
    CHECK(std::memcmp(summed.data(), expect.data(), expect.numel() * sizeof(float)) == 0);
  }
}

/// A random 3x3 stride-1 case (at most n images, 40 input and oc output channels, padding 0 to 2);
/// `side(p)` draws each side of the input plane for padding p.
template <class Pick, class Side>
conv_case random_3x3(Pick& pick, int64_t n, int64_t oc, Side side) {
  conv_case t{};
  t.n = pick(1, n);
  t.c = pick(1, 40);
  t.oc = pick(1, oc);
  t.k = 3;
  t.s = 1;
  t.p = pick(0, 2);
  t.h = side(t.p);
  t.w = side(t.p);
  t.bias = pick(0, 1) == 1;
  t.dx = pick(0, 3) != 0;
  return t;
}

void compare_paths(const conv_case& t, uint64_t seed) {
  for (k::conv_path path : {k::conv_path::automatic, k::conv_path::direct, k::conv_path::winograd})
    compare_path(t, seed, path);
}

} // namespace

TEST_CASE("conv2d's direct and Winograd paths match im2col on the layers of the zoo's networks", "[kernels]") {
  // The reference CNN's two layers, ResNet-20's (3x3 stride 1 and 2, 1x1 projections) at both image sizes.
  for (const conv_case& t : {conv_case{3, 1, 32, 3, 1, 1, 28, 28, true, false}, conv_case{3, 32, 64, 3, 1, 1, 14, 14, true, true},
                             conv_case{2, 16, 16, 3, 1, 1, 28, 28, false, true}, conv_case{2, 16, 32, 3, 2, 1, 28, 28, false, true},
                             conv_case{2, 16, 32, 1, 2, 0, 28, 28, false, true}, conv_case{2, 32, 64, 3, 2, 1, 16, 16, false, true},
                             conv_case{2, 64, 64, 3, 1, 1, 7, 7, false, true}, conv_case{2, 3, 16, 3, 1, 1, 32, 32, false, false}})
    compare_paths(t, 100);
}

TEST_CASE("conv2d's direct and Winograd paths match im2col on random shapes", "[kernels]") {
  std::mt19937_64 rng(2024);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const int64_t kernels[] = {1, 2, 3, 4, 5, 7};
  for (int i = 0; i < 60; ++i) {
    conv_case t{};
    t.n = pick(1, 3);
    t.c = pick(1, 40);
    t.oc = pick(1, 70);
    t.k = kernels[pick(0, 5)];
    t.s = pick(1, 3);
    t.p = pick(0, 2);
    t.h = pick(std::max<int64_t>(1, t.k - 2 * t.p), 17);
    t.w = pick(std::max<int64_t>(1, t.k - 2 * t.p), 17);
    t.bias = pick(0, 1) == 1;
    t.dx = pick(0, 3) != 0;
    compare_paths(t, 1000 + i);
  }
}

TEST_CASE("conv2d's direct path takes a stride-2 convolution's dx by parity classes and matches im2col", "[kernels]") {
  // Every kernel size the direct path has above 1 (k = 1 goes by GEMM), padding 0 to 3, odd and
  // even planes down to a single row or column (where one parity has no positions).
  std::mt19937_64 rng(2222);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  int i = 0;
  for (int64_t k : {3, 5, 7})
    for (int64_t p = 0; p <= 3; ++p)
      for (int rep = 0; rep < 3; ++rep) {
        conv_case t{};
        t.n = pick(1, 3);
        t.c = pick(1, 40);
        t.oc = pick(1, 40);
        t.k = k;
        t.s = 2;
        t.p = p;
        t.h = pick(std::max<int64_t>(1, k - 2 * p), 16);
        t.w = pick(std::max<int64_t>(1, k - 2 * p), 16);
        t.bias = rep == 1;
        t.dx = true;
        compare_path(t, 3000 + i++, k::conv_path::direct);
      }
}

TEST_CASE("conv2d's Winograd path matches im2col on random 3x3 stride-1 shapes", "[kernels]") {
  // Odd and even planes (the last tile half outside), planes smaller than a
  // tile, padding 0 to 2, channel counts around the vector width.
  std::mt19937_64 rng(77);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  for (int i = 0; i < 40; ++i) {
    const conv_case t = random_3x3(pick, 3, 70, [&](int64_t p) { return pick(std::max<int64_t>(1, 3 - 2 * p), 17); });
    compare_path(t, 5000 + i, k::conv_path::winograd);
  }
}

TEST_CASE("conv2d's Winograd path takes F(4x4, 3x3) on planes where it is cheaper and matches im2col there", "[kernels]") {
  // The choice on the zoo's planes (docs/benchmarks.md has the measurements behind it).
  CHECK(k::detail::winograd_tile_side(28, 28) == 4);
  CHECK(k::detail::winograd_tile_side(14, 14) == 2);
  CHECK(k::detail::winograd_tile_side(7, 7) == 4);
  // Output planes of 4k - 1 or 4k positions each way (16 to 32: the last tile partly outside
  // or not): the forward pass and the weight gradient by F(4x4), the data gradient (onto x's
  // plane, 2 larger or smaller than y's with padding 0 or 2) by either.
  std::mt19937_64 rng(4444);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  int forward4 = 0, data4 = 0;
  for (int i = 0; i < 20; ++i) {
    conv_case t = random_3x3(pick, 2, 40, [&](int64_t p) { return 4 * pick(4, 8) - pick(0, 1) + 2 - 2 * p; });
    t.dx = true;
    const int64_t oh = t.h + 2 * t.p - 2, ow = t.w + 2 * t.p - 2;
    forward4 += k::detail::winograd_tile_side(oh, ow) == 4;
    data4 += k::detail::winograd_tile_side(t.h, t.w) == 4;
    compare_path(t, 7000 + i, k::conv_path::winograd);
  }
  CHECK(forward4 == 20);
  CHECK(data4 >= 5);  // 7 of the 20: both data schemes under F(4x4)'s weight gradient
  CHECK(data4 < 20);
}

TEST_CASE("conv2d's Winograd weight gradient over groups of images matches im2col", "[kernels]") {
  // On small planes (7 x 7's 4 tiles of F(4x4), 3 x 3's 4 of F(2x2)) the weight gradient's
  // products take up to 8 images' tiles at once; batches of 9 and 19 leave groups partly
  // filled and more than one group per thread.
  std::mt19937_64 rng(808);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  int i = 0;
  for (int64_t n : {9, 19})
    for (int64_t side : {3, 5, 7, 8}) {
      conv_case t = random_3x3(pick, 1, 40, [&](int64_t p) { return side + 2 - 2 * p; });
      t.n = n;
      t.dx = true;
      compare_path(t, 9000 + i++, k::conv_path::winograd);
    }
}

TEST_CASE("a ReLU fused into conv2d and batch norm gives relu's results", "[kernels]") {
  const k::context ctx = testing::test_context();
  // Stride 1 and stride 2 (dx by parity classes on the direct path, by GEMM on im2col's).
  for (int64_t stride : {1, 2})
    for (k::conv_path path : {k::conv_path::direct, k::conv_path::winograd, k::conv_path::im2col}) {
      INFO("stride " << stride << " " << name(path));
      k::context c = ctx;
      c.conv = path;
      k::conv2d_geometry g{5, 19, 3, stride, 1};
      tensor x = testing::random_tensor({3, 5, 9, 8}, 7), w = testing::random_tensor({19, 5, 3, 3}, 8),
             b = testing::random_tensor({19}, 9);
      tensor y, cols, relu_y, fused, fused_cols;
      k::conv2d_forward(c, x, w, b, g, y, cols);
      k::relu_forward(c, y, relu_y);
      k::conv2d_forward(c, x, w, b, g, fused, fused_cols, true);
      CHECK(max_rel_diff(fused, relu_y) == 0);

      tensor dy = testing::random_tensor(y.shape(), 10), masked, dx1, dw1, db1, dx2, dw2, db2;
      k::relu_backward(c, relu_y, dy, masked);
      k::conv2d_backward(c, x, w, cols, masked, g, &dx1, dw1, &db1);
      k::conv2d_backward(c, x, w, fused_cols, dy, g, &dx2, dw2, &db2, &fused);
      CHECK(max_rel_diff(dx2, dx1) < 1e-6);
      CHECK(max_rel_diff(dw2, dw1) < 1e-6);
      CHECK(max_rel_diff(db2, db1) < 1e-6);
    }

  tensor x = testing::random_tensor({4, 3, 5, 6}, 11), gamma = testing::random_tensor({3}, 12),
         beta = testing::random_tensor({3}, 13);
  tensor rm = tensor::zeros({3}), rv = tensor::full({3}, 1.0f), y, relu_y, fused, mean, invstd;
  k::batch_norm_forward_train(ctx, x, gamma, beta, 1e-5f, 0.1f, rm, rv, y, mean, invstd);
  k::relu_forward(ctx, y, relu_y);
  k::batch_norm_forward_train(ctx, x, gamma, beta, 1e-5f, 0.1f, rm, rv, fused, mean, invstd, true);
  CHECK(max_rel_diff(fused, relu_y) == 0);
  tensor dy = testing::random_tensor(x.shape(), 14), masked, dx1, dg1, db1, dx2, dg2, db2;
  k::relu_backward(ctx, relu_y, dy, masked);
  k::batch_norm_backward(ctx, x, gamma, mean, invstd, masked, dx1, dg1, db1);
  k::batch_norm_backward(ctx, x, gamma, mean, invstd, dy, dx2, dg2, db2, &fused);
  CHECK(max_rel_diff(dx2, dx1) < 1e-6);
  CHECK(max_rel_diff(dg2, dg1) < 1e-6);
  CHECK(max_rel_diff(db2, db1) < 1e-6);
  k::batch_norm_forward_eval(ctx, x, gamma, beta, 1e-5f, rm, rv, y);
  k::relu_forward(ctx, y, relu_y);
  k::batch_norm_forward_eval(ctx, x, gamma, beta, 1e-5f, rm, rv, fused, true);
  CHECK(max_rel_diff(fused, relu_y) == 0);

  tensor a = testing::random_tensor({2, 40}, 15), b2 = testing::random_tensor({2, 40}, 16), s, sum_relu;
  k::add(ctx, a, b2, s);
  k::relu_forward(ctx, s, sum_relu);
  k::add(ctx, a, b2, s, true);
  CHECK(max_rel_diff(s, sum_relu) == 0);

  // A residual block's sum (and its ReLU) in batch norm's pass: add's bits, then relu's; training
  // and evaluation, with and without the ReLU.
  const tensor shortcut = testing::random_tensor(x.shape(), 17);
  for (bool relu : {false, true}) {
    tensor bn, sum, ref, out;
    k::batch_norm_forward_train(ctx, x, gamma, beta, 1e-5f, 0.1f, rm, rv, bn, mean, invstd);
    k::add(ctx, bn, shortcut, ref, relu);
    k::batch_norm_forward_train(ctx, x, gamma, beta, 1e-5f, 0.1f, rm, rv, out, mean, invstd, relu, &shortcut);
    CHECK(max_rel_diff(out, ref) == 0);
    k::batch_norm_forward_eval(ctx, x, gamma, beta, 1e-5f, rm, rv, bn);
    k::add(ctx, bn, shortcut, ref, relu);
    k::batch_norm_forward_eval(ctx, x, gamma, beta, 1e-5f, rm, rv, out, relu, &shortcut);
    CHECK(max_rel_diff(out, ref) == 0);
  }
  const tensor wrong = testing::random_tensor({4, 3, 5, 5}, 18);
  tensor out;
  CHECK_THROWS_WITH(k::batch_norm_forward_train(ctx, x, gamma, beta, 1e-5f, 0.1f, rm, rv, out, mean, invstd, false, &wrong),
                    Catch::Contains("addend"));
}

TEST_CASE("batch norm's backward takes its ReLU's mask from x and the forward's scale and shift with the output's bits",
          "[kernels]") {
  const k::context ctx = testing::test_context();
  // Planes with whole vectors and tails at every width (49, 784, 30 and 1 values), and gammas of both signs.
  for (const shape& s : {shape{3, 4, 7, 7}, shape{2, 5, 28, 28}, shape{4, 3, 5, 6}, shape{9, 6}}) {
    const int64_t c = s[1];
    tensor x = testing::random_tensor(s, 31), gamma = testing::random_tensor({c}, 32),
           beta = testing::random_tensor({c}, 33), dy = testing::random_tensor(s, 34);
    tensor rm = tensor::zeros({c}), rv = tensor::full({c}, 1.0f), y, mean, invstd, affine;
    k::batch_norm_forward_train(ctx, x, gamma, beta, 1e-5f, 0.1f, rm, rv, y, mean, invstd, true, nullptr, &affine);
    REQUIRE(affine.shape() == shape{2, c});
    tensor dx1, dg1, db1, dx2, dg2, db2, dx3, dg3, db3;
    k::batch_norm_backward(ctx, x, gamma, mean, invstd, dy, dx1, dg1, db1, &y);
    k::batch_norm_backward(ctx, x, gamma, mean, invstd, dy, dx2, dg2, db2, nullptr, &affine);
    k::batch_norm_backward(ctx, x, gamma, mean, invstd, dy, dx3, dg3, db3);  // no ReLU
    auto same_bits = [](const tensor& a, const tensor& b) {
      return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.numel() * sizeof(float)) == 0;
    };
    CHECK(same_bits(dx2, dx1));
    CHECK(same_bits(dg2, dg1));
    CHECK(same_bits(db2, db1));
    CHECK(max_rel_diff(dx3, dx1) > 1e-3);  // the mask matters
  }
  tensor x = testing::random_tensor({2, 3, 4, 4}, 35), gamma = testing::random_tensor({3}, 36), dx, dg, db;
  tensor mean = tensor::zeros({3}), invstd = tensor::full({3}, 1.0f), short_affine = tensor::zeros({2, 2});
  CHECK_THROWS_WITH(k::batch_norm_backward(ctx, x, gamma, mean, invstd, x, dx, dg, db, nullptr, &short_affine),
                    Catch::Contains("relu_affine"));
}

TEST_CASE("conv2d reads its input through a batch norm's map with the bits of the mapped input, on every path",
          "[kernels]") {
  // x stands for max(x * scale + shift, 0) per channel (a batch norm's output never written): the convolution
  // of channel_affine_relu(x) on Winograd's path (which reads x through the map), the direct one and im2col
  // (which make the mapped input first). The same bits where the kernel set has fused multiply-adds; the
  // generic set's vectors round the product first (within float rounding of it).
  const bool fused = k::cpu_kernels_name() != "generic";
  for (const conv_case& t : {conv_case{3, 16, 16, 3, 1, 1, 28, 28, false, true}, conv_case{2, 5, 9, 3, 1, 1, 7, 6, true, true},
                             conv_case{4, 32, 32, 3, 1, 1, 14, 14, false, true}, conv_case{2, 6, 4, 5, 2, 2, 9, 9, true, false}})
    for (k::conv_path path : {k::conv_path::winograd, k::conv_path::direct, k::conv_path::im2col}) {
      INFO(t.describe() << ", path " << (path == k::conv_path::im2col ? "im2col" : name(path)));
      k::context ctx = testing::test_context();
      ctx.conv = path;
      const k::conv2d_geometry g{t.c, t.oc, t.k, t.s, t.p};
      const tensor x = testing::random_tensor({t.n, t.c, t.h, t.w}, 41), w = testing::random_tensor({t.oc, t.c, t.k, t.k}, 42);
      const tensor bias = t.bias ? testing::random_tensor({t.oc}, 43) : tensor();
      tensor map = testing::random_tensor({2, t.c}, 44);  // scales of both signs: some channels mostly cut
      tensor z, y_want, y_got, cols_want, cols_got;
      k::channel_affine_relu(ctx, x, map, z);
      k::conv2d_forward(ctx, z, w, bias, g, y_want, cols_want);
      k::conv2d_forward(ctx, x, w, bias, g, y_got, cols_got, false, &map);
      const tensor dy = testing::random_tensor(y_want.shape(), 45);
      tensor dx_want, dw_want, db_want, dx_got, dw_got, db_got;
      k::conv2d_backward(ctx, z, w, cols_want, dy, g, t.dx ? &dx_want : nullptr, dw_want, t.bias ? &db_want : nullptr);
      k::conv2d_backward(ctx, x, w, cols_got, dy, g, t.dx ? &dx_got : nullptr, dw_got, t.bias ? &db_got : nullptr,
                         nullptr, nullptr, &map);
      auto same = [&](const tensor& a, const tensor& b) {
        if (a.shape() != b.shape()) return false;
        if (fused) return std::memcmp(a.data(), b.data(), a.numel() * sizeof(float)) == 0;
        return max_rel_diff(a, b) < 1e-4;
      };
      CHECK(same(y_got, y_want));
      CHECK(same(dw_got, dw_want));
      if (t.dx) CHECK(same(dx_got, dx_want));
      if (t.bias) CHECK(same(db_got, db_want));
      CHECK(max_rel_diff(y_got, y_want) < 1e-5);
    }
  const k::context ctx = testing::test_context();
  tensor x = testing::random_tensor({1, 3, 5, 5}, 46), w = testing::random_tensor({2, 3, 3, 3}, 47), y, cols;
  tensor short_map = tensor::zeros({2, 2});
  CHECK_THROWS_WITH(k::conv2d_forward(ctx, x, w, tensor(), {3, 2, 3, 1, 1}, y, cols, false, &short_map),
                    Catch::Contains("input_map"));
}

TEST_CASE("batch norm without its output gives the same statistics and map, and inference's map is forward_eval's",
          "[kernels]") {
  const k::context ctx = testing::test_context();
  const shape s{3, 4, 6, 5};
  const tensor x = testing::random_tensor(s, 51), gamma = testing::random_tensor({4}, 52), beta = testing::random_tensor({4}, 53);
  tensor rm1 = tensor::zeros({4}), rv1 = tensor::full({4}, 1.0f), rm2 = rm1.clone(), rv2 = rv1.clone();
  tensor y1, m1, i1, a1, y2, m2, i2, a2;
  k::batch_norm_forward_train(ctx, x, gamma, beta, 1e-5f, 0.1f, rm1, rv1, y1, m1, i1, true, nullptr, &a1);
  k::batch_norm_forward_train(ctx, x, gamma, beta, 1e-5f, 0.1f, rm2, rv2, y2, m2, i2, true, nullptr, &a2, false);
  CHECK_FALSE(y2.defined());
  for (const auto& [p, q] : {std::pair<const tensor*, const tensor*>{&m1, &m2}, {&i1, &i2}, {&a1, &a2}, {&rm1, &rm2}, {&rv1, &rv2}})
    CHECK(std::memcmp(p->data(), q->data(), p->numel() * sizeof(float)) == 0);
  tensor z;  // the written output is the map applied to x
  k::channel_affine_relu(ctx, x, a1, z);
  CHECK(max_rel_diff(z, y1) < 1e-6);
  tensor ye, eval_map, ze;
  k::batch_norm_forward_eval(ctx, x, gamma, beta, 1e-5f, rm1, rv1, ye, true);
  k::batch_norm_eval_affine(gamma, beta, 1e-5f, rm1, rv1, eval_map);
  k::channel_affine_relu(ctx, x, eval_map, ze);
  CHECK(max_rel_diff(ze, ye) < 1e-6);
  CHECK_THROWS_WITH(k::batch_norm_forward_train(ctx, x, gamma, beta, 1e-5f, 0.1f, rm2, rv2, y2, m2, i2, true, nullptr,
                                                nullptr, false),
                    Catch::Contains("saved_affine"));
}
