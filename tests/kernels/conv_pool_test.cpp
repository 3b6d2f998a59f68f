// conv2d_relu_pool_forward and _backward (a convolution, its ReLU and a 2x2
// max pool of stride 2 in one pass per image) against the three kernels run
// one after the other: the same bits forward (values and maxima) and
// backward.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <sstream>
#include <vector>

#include "kernels/kernels.hpp"
#include "tests/gradcheck.hpp"

using namespace troupe;
namespace k = troupe::kernels;

namespace {

using testing::max_rel_diff;

struct pool_case {
  int64_t n, c, oc, k, p, h, w;
  bool bias, dx;
  k::conv_path path;
  std::string describe() const {
    std::ostringstream os;
    os << "n " << n << " c " << c << " oc " << oc << " k " << k << " p " << p << " h " << h << " w " << w
       << (bias ? " bias" : "") << (dx ? " dx" : "") << (path == k::conv_path::winograd ? " winograd" : " direct");
    return os.str();
  }
};

void compare(const pool_case& t, uint64_t seed, int threads) {
  INFO(t.describe() << ", " << threads << " threads");
  k::context ctx = testing::test_context();
  ctx.threads = threads;
  ctx.conv = t.path;
  const k::conv2d_geometry g{t.c, t.oc, t.k, 1, t.p};
  REQUIRE(k::conv2d_relu_pool_supported(ctx, g));
  tensor x = testing::random_tensor({t.n, t.c, t.h, t.w}, seed);
  tensor w = testing::random_tensor({t.oc, t.c, t.k, t.k}, seed + 1);
  tensor b = t.bias ? testing::random_tensor({t.oc}, seed + 2) : tensor();

  // The three kernels one after the other.
  tensor conv_y, cols, y_ref;
  std::vector<int32_t> argmax;
  k::conv2d_forward(ctx, x, w, b, g, conv_y, cols, true);
  k::max_pool2d_forward(ctx, conv_y, k::pool2d_geometry{}, y_ref, argmax);
  // In one pass.
  tensor y, window;
  k::conv2d_relu_pool_forward(ctx, x, w, b, g, y, window);
  CHECK(max_rel_diff(y, y_ref) == 0);
  const int64_t oh = conv_y.dim(2), ow = conv_y.dim(3), ph = y.dim(2), pw = y.dim(3);
  REQUIRE(window.rank() == 3);
  REQUIRE((window.dim(0) == t.n && window.dim(1) == ph * pw && window.dim(2) >= t.oc));
  int64_t wrong_places = 0;
  for (int64_t i = 0; i < y.numel(); ++i) {  // y [n, oc, ph, pw]; window [n, ph * pw, ocp]
    const int64_t plane = i / (ph * pw), at = i % (ph * pw), py = at / pw, px = at % pw;
    const int64_t image = plane / t.oc, channel = plane % t.oc;
    const int place = static_cast<int>(window.at((image * ph * pw + at) * window.dim(2) + channel));
    const int64_t flat = plane * oh * ow + (2 * py + place / 2) * ow + 2 * px + place % 2;
    wrong_places += flat != argmax[static_cast<std::size_t>(i)];
  }
  CHECK(wrong_places == 0);

  tensor dy = testing::random_tensor(y.shape(), seed + 3), spread, dx1, dw1, db1, dx2, dw2, db2;
  k::max_pool2d_backward(ctx, dy, argmax, conv_y.shape(), spread);
  k::conv2d_backward(ctx, x, w, cols, spread, g, t.dx ? &dx1 : nullptr, dw1, t.bias ? &db1 : nullptr, &conv_y);
  k::conv2d_relu_pool_backward(ctx, x, w, dy, y, window, g, t.dx ? &dx2 : nullptr, dw2, t.bias ? &db2 : nullptr);
  CHECK(max_rel_diff(dw2, dw1) == 0);
  if (t.dx) CHECK(max_rel_diff(dx2, dx1) == 0);
  if (t.bias) CHECK(max_rel_diff(db2, db1) == 0);
}

} // namespace

TEST_CASE("conv2d with its ReLU and a 2x2 max pool in one pass gives the three kernels' results", "[kernels]") {
  // The reference CNN's two blocks first, then random shapes: odd planes (a last row or column no window
  // covers), channel counts around the vector width, both paths.
  compare({3, 1, 32, 3, 1, 28, 28, true, false, k::conv_path::direct}, 10, 2);
  compare({3, 32, 64, 3, 1, 14, 14, true, true, k::conv_path::winograd}, 20, 2);
  std::mt19937_64 rng(31);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const int64_t kernels[] = {1, 3, 5};
  for (int i = 0; i < 40; ++i) {
    pool_case t{};
    t.path = pick(0, 1) ? k::conv_path::winograd : k::conv_path::direct;
    t.k = t.path == k::conv_path::winograd ? 3 : kernels[pick(0, 2)];
    t.p = pick(0, std::min<int64_t>(t.k - 1, 2));
    t.n = pick(1, 3);
    t.c = pick(1, 40);
    t.oc = pick(1, 70);
    t.h = pick(t.k - 2 * t.p + 1, 15);  // the convolution's output at least 2 x 2
    t.w = pick(t.k - 2 * t.p + 1, 15);
    t.bias = pick(0, 1) == 1;
    t.dx = pick(0, 3) != 0;
    compare(t, 300 + 10 * i, static_cast<int>(pick(1, 2)));
  }
}

TEST_CASE("conv2d_relu_pool refuses what it cannot do, naming it", "[kernels]") {
  k::context ctx = testing::test_context();
  tensor x = testing::random_tensor({2, 4, 8, 8}, 1), w = testing::random_tensor({8, 4, 3, 3}, 2), y, window;
  ctx.conv = k::conv_path::im2col;
  CHECK_FALSE(k::conv2d_relu_pool_supported(ctx, k::conv2d_geometry{4, 8, 3, 1, 1}));
  CHECK_THROWS_WITH(k::conv2d_relu_pool_forward(ctx, x, w, tensor(), k::conv2d_geometry{4, 8, 3, 1, 1}, y, window),
                    Catch::Contains("direct kernels"));
  ctx.conv = k::conv_path::automatic;
  CHECK_FALSE(k::conv2d_relu_pool_supported(ctx, k::conv2d_geometry{4, 8, 3, 2, 1}));  // stride 2
  tensor tiny = testing::random_tensor({1, 4, 3, 3}, 3);  // a 1 x 1 output
  CHECK_THROWS_WITH(k::conv2d_relu_pool_forward(ctx, tiny, w, tensor(), k::conv2d_geometry{4, 8, 3, 1, 0}, y, window),
                    Catch::Contains("smaller than the 2x2 window"));
}
