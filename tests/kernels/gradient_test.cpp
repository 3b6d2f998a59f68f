// Every backward kernel against central differences of its forward pass.
// The loss is L = sum(y * r) for a fixed random r, so dL/dy = r.
#include <algorithm>
#include <cmath>
#include <utility>

#include <catch2/catch.hpp>

#include "kernels/kernels.hpp"
#include "tests/gradcheck.hpp"

using namespace troupe;
using namespace troupe::testing;
namespace k = troupe::kernels;

namespace {
const k::context ctx = test_context();
// Double-precision friendly step for float kernels.
constexpr double eps = 1e-2;
} // namespace

TEST_CASE("dense backward matches numerical gradients", "[kernels][grad]") {
  tensor x = random_tensor({3, 5}, 1), w = random_tensor({4, 5}, 2), b = random_tensor({4}, 3);
  tensor y, dx, dw, db;
  k::dense_forward(ctx, x, w, b, y);
  tensor r = random_tensor(y.shape(), 4);
  k::dense_backward(ctx, x, w, r, &dx, dw, &db);
  auto loss = [&] { k::dense_forward(ctx, x, w, b, y); return dot(y, r); };
  check_gradient(x, dx, loss, eps);
  check_gradient(w, dw, loss, eps);
  check_gradient(b, db, loss, eps);
}

TEST_CASE("dense without bias or input gradient", "[kernels][grad]") {
  tensor x = random_tensor({2, 3}, 5), w = random_tensor({2, 3}, 6);
  tensor y, dw;
  k::dense_forward(ctx, x, w, tensor(), y);
  tensor r = random_tensor(y.shape(), 7);
  k::dense_backward(ctx, x, w, r, nullptr, dw, nullptr);
  check_gradient(w, dw, [&] { k::dense_forward(ctx, x, w, tensor(), y); return dot(y, r); }, eps);
}

TEST_CASE("conv2d backward matches numerical gradients", "[kernels][grad]") {
  struct cfg { int64_t c, oc, k, s, p, h, w; };
  auto c = GENERATE(cfg{2, 3, 3, 1, 1, 5, 6}, cfg{1, 2, 3, 2, 0, 7, 7}, cfg{3, 2, 2, 2, 1, 4, 5},
                    cfg{2, 2, 1, 1, 0, 3, 3}, cfg{2, 3, 5, 1, 2, 6, 5}, cfg{3, 2, 3, 2, 1, 6, 7},
                    cfg{2, 17, 3, 1, 1, 4, 5});
  k::context path = ctx;
  path.conv = GENERATE(k::conv_path::direct, k::conv_path::winograd, k::conv_path::im2col);
  INFO("path " << int(path.conv) << " (1 direct, 2 winograd, 3 im2col), c " << c.c << " oc " << c.oc
               << " k " << c.k << " s " << c.s << " p " << c.p);
  k::conv2d_geometry g{c.c, c.oc, c.k, c.s, c.p};
  tensor x = random_tensor({2, c.c, c.h, c.w}, 11), w = random_tensor({c.oc, c.c, c.k, c.k}, 12),
         b = random_tensor({c.oc}, 13);
  tensor y, cols, dx, dw, db;
  k::conv2d_forward(path, x, w, b, g, y, cols);
  tensor r = random_tensor(y.shape(), 14);
  k::conv2d_backward(path, x, w, cols, r, g, &dx, dw, &db);
  auto loss = [&] { k::conv2d_forward(path, x, w, b, g, y, cols); return dot(y, r); };
  check_gradient(x, dx, loss, eps);
  check_gradient(w, dw, loss, eps);
  check_gradient(b, db, loss, eps);
}

TEST_CASE("conv2d forward matches a direct convolution", "[kernels]") {
  k::conv2d_geometry g{2, 3, 3, 2, 1};
  tensor x = random_tensor({2, 2, 6, 5}, 21), w = random_tensor({3, 2, 3, 3}, 22), b = random_tensor({3}, 23);
  tensor y, cols;
  k::context path = ctx;
  path.conv = GENERATE(k::conv_path::direct, k::conv_path::winograd, k::conv_path::im2col);
  k::conv2d_forward(path, x, w, b, g, y, cols);
  REQUIRE(y.shape() == shape{2, 3, 3, 3});
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t o = 0; o < 3; ++o)
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t j = 0; j < 3; ++j) {
          double s = b.at(o);
          for (int64_t c = 0; c < 2; ++c)
            for (int64_t u = 0; u < 3; ++u)
              for (int64_t v = 0; v < 3; ++v) {
                int64_t ih = i * 2 - 1 + u, iw = j * 2 - 1 + v;
                if (ih < 0 || ih >= 6 || iw < 0 || iw >= 5) continue;
                s += double(x.at(((n * 2 + c) * 6 + ih) * 5 + iw)) * w.at(((o * 2 + c) * 3 + u) * 3 + v);
              }
          CHECK(y.at(((n * 3 + o) * 3 + i) * 3 + j) == Approx(s).epsilon(1e-4).margin(1e-5));
        }
}

TEST_CASE("2x2 max pooling gives the first maximum of each window, at any width", "[kernels]") {
  // The 2x2 stride-2 window has a vector path (16 outputs at a time, masked
  // tails): rows of 1 to 35 outputs, odd input widths, many ties (values 0-3).
  for (int64_t w = 2; w <= 71; ++w)
    for (int64_t h : {2, 5}) {
      INFO("h " << h << " w " << w);
      tensor x = tensor::empty({2, 3, h, w});
      for (int64_t i = 0; i < x.numel(); ++i) x.at(i) = static_cast<float>((i * 7 + i / 5) % 4);
      tensor y;
      std::vector<int32_t> argmax;
      k::max_pool2d_forward(ctx, x, {2, 2}, y, argmax);
      const int64_t oh = h / 2, ow = w / 2;
      REQUIRE(y.shape() == shape{2, 3, oh, ow});
      for (int64_t pl = 0; pl < 6; ++pl)
        for (int64_t r = 0; r < oh; ++r)
          for (int64_t c = 0; c < ow; ++c) {
            int64_t at = pl * h * w + 2 * r * w + 2 * c;
            for (int64_t idx : {at + 1, at + w, at + w + 1})
              if (x.at(idx) > x.at(at)) at = idx;
            const int64_t o = (pl * oh + r) * ow + c;
            REQUIRE(y.at(o) == x.at(at));
            REQUIRE(argmax[static_cast<std::size_t>(o)] == at);
          }
    }
}

TEST_CASE("pooling backward matches numerical gradients", "[kernels][grad]") {
  k::pool2d_geometry g = GENERATE(k::pool2d_geometry{2, 2}, k::pool2d_geometry{3, 2}, k::pool2d_geometry{2, 1});
  // Distinct values keep max pooling differentiable under the perturbation.
  tensor x = tensor::empty({2, 2, 6, 7});
  for (int64_t i = 0; i < x.numel(); ++i) x.at(i) = static_cast<float>((i * 37) % 101) * 0.1f;
  tensor y, dx;
  std::vector<int32_t> argmax;
  SECTION("max") {
    k::max_pool2d_forward(ctx, x, g, y, argmax);
    tensor r = random_tensor(y.shape(), 31);
    k::max_pool2d_backward(ctx, r, argmax, x.shape(), dx);
    check_gradient(x, dx, [&] { k::max_pool2d_forward(ctx, x, g, y, argmax); return dot(y, r); }, 1e-2);
  }
  SECTION("average") {
    k::avg_pool2d_forward(ctx, x, g, y);
    tensor r = random_tensor(y.shape(), 32);
    k::avg_pool2d_backward(ctx, r, g, x.shape(), dx);
    check_gradient(x, dx, [&] { k::avg_pool2d_forward(ctx, x, g, y); return dot(y, r); }, eps);
  }
}

TEST_CASE("activation backward passes match numerical gradients", "[kernels][grad]") {
  tensor x = random_tensor({4, 9}, 41);
  // Keep ReLU inputs away from the kink at 0.
  for (int64_t i = 0; i < x.numel(); ++i)
    if (std::abs(x.at(i)) < 0.05f) x.at(i) = 0.3f;
  tensor r = random_tensor(x.shape(), 42), y, dx;
  SECTION("relu") {
    k::relu_forward(ctx, x, y);
    k::relu_backward(ctx, y, r, dx);
    check_gradient(x, dx, [&] { k::relu_forward(ctx, x, y); return dot(y, r); }, 1e-3);
  }
  SECTION("tanh") {
    k::tanh_forward(ctx, x, y);
    k::tanh_backward(ctx, y, r, dx);
    check_gradient(x, dx, [&] { k::tanh_forward(ctx, x, y); return dot(y, r); }, eps);
  }
  SECTION("sigmoid") {
    k::sigmoid_forward(ctx, x, y);
    k::sigmoid_backward(ctx, y, r, dx);
    check_gradient(x, dx, [&] { k::sigmoid_forward(ctx, x, y); return dot(y, r); }, eps);
  }
  SECTION("dropout (fixed mask)") {
    tensor mask;
    k::dropout_forward(ctx, x, 0.4f, 7, 0, mask, y);
    k::dropout_backward(ctx, r, mask, dx);
    check_gradient(x, dx, [&] { k::dropout_forward(ctx, x, 0.4f, 7, 0, mask, y); return dot(y, r); }, eps);
  }
}

TEST_CASE("batch norm backward matches numerical gradients", "[kernels][grad]") {
  shape s = GENERATE(shape{6, 3}, shape{3, 2, 3, 4});
  const int64_t c = s[1];
  tensor x = random_tensor(s, 51), gamma = random_tensor({c}, 52, 0.5f, 1.5f), beta = random_tensor({c}, 53);
  tensor rm = tensor::zeros({c}), rv = tensor::full({c}, 1.0f);
  tensor y, mean, invstd, dx, dgamma, dbeta;
  k::batch_norm_forward_train(ctx, x, gamma, beta, 1e-5f, 0.1f, rm, rv, y, mean, invstd);
  tensor r = random_tensor(y.shape(), 54);
  k::batch_norm_backward(ctx, x, gamma, mean, invstd, r, dx, dgamma, dbeta);
  auto loss = [&] {
    tensor m2 = rm.clone(), v2 = rv.clone();
    k::batch_norm_forward_train(ctx, x, gamma, beta, 1e-5f, 0.1f, m2, v2, y, mean, invstd);
    return dot(y, r);
  };
  check_gradient(x, dx, loss, 1e-2, 3e-2);
  check_gradient(gamma, dgamma, loss, eps);
  check_gradient(beta, dbeta, loss, eps);
}

TEST_CASE("softmax cross-entropy gradient and value", "[kernels][grad]") {
  tensor z = random_tensor({5, 4}, 61, -2.0f, 2.0f), dz;
  std::vector<int32_t> labels{0, 3, 1, 2, 3};
  k::softmax_cross_entropy(ctx, z, labels, &dz);
  check_gradient(z, dz, [&] { return k::softmax_cross_entropy(ctx, z, labels, nullptr); }, 1e-2);

  // Uniform logits: loss = log(classes).
  tensor u = tensor::zeros({2, 4});
  CHECK(k::softmax_cross_entropy(ctx, u, {1, 2}, nullptr) == Approx(std::log(4.0)));
  CHECK_THROWS_WITH(k::softmax_cross_entropy(ctx, u, {1, 4}, nullptr), Catch::Contains("label 4"));
}

TEST_CASE("batch norm running statistics and evaluation mode", "[kernels]") {
  tensor x = tensor::from({4, 1}, {1, 2, 3, 4}), g = tensor::full({1}, 1.0f), b = tensor::zeros({1});
  tensor rm = tensor::zeros({1}), rv = tensor::full({1}, 1.0f), y, m, is;
  k::batch_norm_forward_train(ctx, x, g, b, 0.0f, 0.5f, rm, rv, y, m, is);
  CHECK(m.at(0) == Approx(2.5));
  CHECK(rm.at(0) == Approx(1.25));             // 0.5 * 0 + 0.5 * 2.5
  CHECK(rv.at(0) == Approx(0.5 + 0.5 * 5.0 / 3));  // unbiased variance 5/3
  CHECK(y.at(0) == Approx(-1.5 / std::sqrt(1.25)));
  k::batch_norm_forward_eval(ctx, x, g, b, 0.0f, rm, rv, y);
  CHECK(y.at(3) == Approx((4 - rm.at(0)) / std::sqrt(rv.at(0))));
}

TEST_CASE("batch norm: the same bits on one thread and on three (training and evaluation), statistics exact far from zero", "[kernels]") {
  // Large enough to be split over threads (by images), and a mean of 1000 with a spread of 0.01:
  // a one-pass sum of squares would lose the variance to cancellation in float.
  const shape s{12, 5, 24, 24};
  const int64_t c = s[1];
  tensor x = random_tensor(s, 71, 999.99f, 1000.01f), addend = random_tensor(s, 72);
  tensor gamma = random_tensor({c}, 73, 0.5f, 1.5f), beta = random_tensor({c}, 74), dy = random_tensor(s, 75);
  struct result { tensor y, mean, invstd, affine, rm, rv, dx_out, dx_affine, dgamma, dbeta, eval; };
  auto run = [&](int threads) {
    const k::context one = k::context::with_threads(threads);
    result r;
    r.rm = tensor::zeros({c});
    r.rv = tensor::full({c}, 1.0f);
    k::batch_norm_forward_train(one, x, gamma, beta, 1e-5f, 0.1f, r.rm, r.rv, r.y, r.mean, r.invstd, true, &addend,
                                &r.affine);
    k::batch_norm_backward(one, x, gamma, r.mean, r.invstd, dy, r.dx_out, r.dgamma, r.dbeta, &r.y);
    tensor dg, db;
    k::batch_norm_backward(one, x, gamma, r.mean, r.invstd, dy, r.dx_affine, dg, db, nullptr, &r.affine);
    k::batch_norm_forward_eval(one, x, gamma, beta, 1e-5f, r.rm, r.rv, r.eval, true, &addend);
    return r;
  };
  const result a = run(1), b = run(3);
  for (auto [u, v] : {std::pair{&a.y, &b.y}, {&a.mean, &b.mean}, {&a.invstd, &b.invstd}, {&a.affine, &b.affine},
                      {&a.rm, &b.rm}, {&a.rv, &b.rv}, {&a.dx_out, &b.dx_out}, {&a.dx_affine, &b.dx_affine},
                      {&a.dgamma, &b.dgamma}, {&a.dbeta, &b.dbeta}, {&a.eval, &b.eval}})
    CHECK(std::equal(u->data(), u->data() + u->numel(), v->data()));
  // Each channel's mean and 1/std against a two-pass reference in double.
  const int64_t inner = s[2] * s[3];
  for (int64_t ch = 0; ch < c; ++ch) {
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < s[0]; ++i)
      for (int64_t p = 0; p < inner; ++p) sum += x.data()[(i * c + ch) * inner + p];
    const double mean = sum / static_cast<double>(s[0] * inner);
    for (int64_t i = 0; i < s[0]; ++i)
      for (int64_t p = 0; p < inner; ++p) {
        const double d = x.data()[(i * c + ch) * inner + p] - mean;
        sq += d * d;
      }
    const double invstd = 1.0 / std::sqrt(sq / static_cast<double>(s[0] * inner) + 1e-5);
    CHECK(a.mean.at(ch) == Approx(mean).epsilon(1e-7));
    CHECK(a.invstd.at(ch) == Approx(invstd).epsilon(1e-4));
  }
}

TEST_CASE("clip_by_global_norm scales every part by max_norm / norm above it, none below", "[kernels][clip]") {
  const troupe::kernels::context ctx = troupe::kernels::context::with_threads(2);
  std::vector<float> a{3, 0, 0}, b{0, 4};  // joint norm 5
  std::vector<std::pair<float*, int64_t>> parts{{a.data(), 3}, {b.data(), 2}};
  CHECK(troupe::kernels::clip_by_global_norm(ctx, parts, 10.0) == Approx(5.0));
  CHECK(a[0] == 3.0f);  // below the limit: untouched
  CHECK(troupe::kernels::clip_by_global_norm(ctx, parts, 2.5) == Approx(5.0));
  CHECK(a[0] == Approx(1.5f));
  CHECK(b[1] == Approx(2.0f));
  CHECK(troupe::kernels::clip_by_global_norm(ctx, parts, 0.0) == Approx(2.5));  // 0: no clipping, the norm
  // The same values cut into other parts: the same norm, bit for bit.
  std::vector<float> whole{1.5f, 0, 0, 0, 2.0f};
  CHECK(troupe::kernels::clip_by_global_norm(ctx, {{whole.data(), 5}}, 0.0) ==
        troupe::kernels::clip_by_global_norm(ctx, parts, 0.0));
}
