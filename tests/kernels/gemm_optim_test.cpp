#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <thread>
#include <vector>

#include "kernels/kernels.hpp"
#include "kernels/sequence.hpp"
#include "tests/gradcheck.hpp"

using namespace troupe;
namespace k = troupe::kernels;

namespace {
const k::context ctx = testing::test_context();

/// Row-major m x n reference product of a [m, kk] and b [kk, n], in double.
std::vector<double> naive_product(const tensor& a, const tensor& b, int64_t m, int64_t n, int64_t kk) {
  std::vector<double> c(static_cast<std::size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < kk; ++p)
      for (int64_t j = 0; j < n; ++j) c[i * n + j] += double(a.at(i * kk + p)) * b.at(p * n + j);
  return c;
}
} // namespace

TEST_CASE("gemm matches a naive product for every transpose and both backends", "[kernels][gemm]") {
  k::context c2 = ctx;
  c2.gemm = GENERATE(k::gemm_backend::openblas, k::gemm_backend::eigen);
  const int64_t m = 7, n = 5, kk = 9;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      tensor a = testing::random_tensor(ta ? shape{kk, m} : shape{m, kk}, 1);
      tensor b = testing::random_tensor(tb ? shape{n, kk} : shape{kk, n}, 2);
      tensor c = testing::random_tensor({m, n}, 3), c0 = c.clone();
      k::gemm(c2, ta, tb, m, n, kk, 0.5f, a.data(), ta ? m : kk, b.data(), tb ? kk : n, 2.0f, c.data(), n);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t p = 0; p < kk; ++p)
            s += double(ta ? a.at(p * m + i) : a.at(i * kk + p)) * (tb ? b.at(j * kk + p) : b.at(p * n + j));
          INFO("ta " << ta << " tb " << tb << " at " << i << "," << j);
          CHECK(c.at(i * n + j) == Approx(0.5 * s + 2.0 * c0.at(i * n + j)).epsilon(1e-4).margin(1e-5));
        }
    }
}

TEST_CASE("gemm split over threads writes every block of C, by rows and by columns, inside strided matrices",
          "[kernels][gemm]") {
  // Shapes above the split threshold whose blocks are uneven (not multiples of 16 x threads): wide C (cut by
  // columns), tall C (by rows), C the largest matrix (k smallest: by rows), the MLP's largest, and one on
  // OpenBLAS's own threads; each on 1 to 3 threads. Leading dimensions exceed the matrices' widths: a block
  // that strayed past its columns would show in the padding.
  const int threads = GENERATE(1, 2, 3);
  k::context c2 = k::context::with_threads(threads);
  struct dims { int64_t m, n, kk; };
  // The last is above the size where OpenBLAS's own threading takes over.
  for (dims d : {dims{37, 301, 97}, dims{301, 37, 97}, dims{150, 133, 20}, dims{64, 256, 784}, dims{257, 257, 512}}) {
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const int64_t pad = 3, lda = (ta ? d.m : d.kk) + pad, ldb = (tb ? d.kk : d.n) + pad, ldc = d.n + pad;
        tensor a = testing::random_tensor({ta ? d.kk : d.m, lda}, 1);
        tensor b = testing::random_tensor({tb ? d.n : d.kk, ldb}, 2);
        tensor c = testing::random_tensor({d.m, ldc}, 3), c0 = c.clone();
        k::gemm(c2, ta, tb, d.m, d.n, d.kk, 1.5f, a.data(), lda, b.data(), ldb, 0.5f, c.data(), ldc);
        int64_t wrong = 0;
        for (int64_t i = 0; i < d.m; ++i)
          for (int64_t j = 0; j < ldc; ++j) {
            const double was = c0.at(i * ldc + j);
            double want = was;  // the padding stays
            if (j < d.n) {
              double s = 0;
              for (int64_t p = 0; p < d.kk; ++p)
                s += double(ta ? a.at(p * lda + i) : a.at(i * lda + p)) * (tb ? b.at(j * ldb + p) : b.at(p * ldb + j));
              want = 1.5 * s + 0.5 * was;
            }
            wrong += std::abs(c.at(i * ldc + j) - want) > 1e-4 * (1.0 + std::abs(want));
          }
        INFO(d.m << "x" << d.n << "x" << d.kk << " ta " << ta << " tb " << tb << ", " << threads << " threads");
        CHECK(wrong == 0);
      }
  }
}

TEST_CASE("axpy and the large-tensor optimizer steps split over threads compute every element", "[kernels][optim]") {
  // Sizes below and above the threading grain, and one not divisible by the thread count.
  const k::context c = k::context::with_threads(GENERATE(1, 2, 3));
  for (int64_t n : {int64_t{5}, int64_t{1} << 15, (int64_t{1} << 17) + 3}) {
    INFO("n = " << n << ", threads " << c.threads);
    std::vector<float> x(n), y(n);
    for (int64_t i = 0; i < n; ++i) {
      x[i] = static_cast<float>(i % 7) - 3.0f;
      y[i] = static_cast<float>(i % 5);
    }
    k::axpy(c, n, -0.5f, x.data(), y.data());
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += y[i] != static_cast<float>(i % 5) - 0.5f * (static_cast<float>(i % 7) - 3.0f);
    CHECK(wrong == 0);
    tensor w = tensor::zeros({n}), g = tensor::zeros({n}), v = tensor::zeros({n});
    for (int64_t i = 0; i < n; ++i) g.data()[i] = static_cast<float>(i % 3);
    k::momentum_step(c, w, g, v, 0.5f, 0.9f, 0.0f, false);
    wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += w.data()[i] != -0.5f * static_cast<float>(i % 3) || v.data()[i] != g.data()[i];
    CHECK(wrong == 0);
  }
}

TEST_CASE("optimizer steps against hand-computed values", "[kernels][optim]") {
  SECTION("sgd with weight decay") {
    tensor w = tensor::from({2}, {1.0f, -2.0f}), g = tensor::from({2}, {0.5f, 0.25f});
    k::sgd_step(ctx, w, g, 0.1f, 0.01f);
    CHECK(w.at(0) == Approx(1.0 - 0.1 * (0.5 + 0.01 * 1.0)));
    CHECK(w.at(1) == Approx(-2.0 - 0.1 * (0.25 - 0.02)));
  }
  SECTION("momentum, two steps") {
    tensor w = tensor::from({1}, {1.0f}), g = tensor::from({1}, {1.0f}), v = tensor::zeros({1});
    k::momentum_step(ctx, w, g, v, 0.1f, 0.9f, 0.0f, false);  // v = 1, w = 0.9
    CHECK(v.at(0) == Approx(1.0));
    CHECK(w.at(0) == Approx(0.9));
    k::momentum_step(ctx, w, g, v, 0.1f, 0.9f, 0.0f, false);  // v = 1.9, w = 0.71
    CHECK(v.at(0) == Approx(1.9));
    CHECK(w.at(0) == Approx(0.71));
  }
  SECTION("nesterov") {
    tensor w = tensor::from({1}, {1.0f}), g = tensor::from({1}, {1.0f}), v = tensor::zeros({1});
    k::momentum_step(ctx, w, g, v, 0.1f, 0.9f, 0.0f, true);  // v = 1, w -= 0.1 * (1 + 0.9)
    CHECK(w.at(0) == Approx(0.81));
  }
  SECTION("adam, two steps") {
    tensor w = tensor::from({1}, {1.0f}), g = tensor::from({1}, {0.5f}), m = tensor::zeros({1}), v = tensor::zeros({1});
    k::adam_step(ctx, w, g, m, v, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, 1);
    // Step 1: m_hat = g, v_hat = g^2: the update is lr * sign(g).
    CHECK(w.at(0) == Approx(0.9).epsilon(1e-6));
    g.at(0) = -0.5f;
    k::adam_step(ctx, w, g, m, v, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, 2);
    double m2 = 0.9 * 0.05 + 0.1 * -0.5, v2 = 0.999 * 0.00025 + 0.001 * 0.25;
    double mh = m2 / (1 - 0.81), vh = v2 / (1 - 0.999 * 0.999);
    CHECK(w.at(0) == Approx(0.9 - 0.1 * mh / (std::sqrt(vh) + 1e-8)).epsilon(1e-5));
  }
}

TEST_CASE("all_finite finds NaN and infinity", "[kernels]") {
  tensor t = tensor::from({3}, {1.0f, 2.0f, 3.0f});
  CHECK(k::all_finite(ctx, t));
  t.at(1) = std::nanf("");
  CHECK_FALSE(k::all_finite(ctx, t));
  t.at(1) = INFINITY;
  CHECK_FALSE(k::all_finite(ctx, t));
}

TEST_CASE("kernels give the same result in a 1-thread and a 2-thread context", "[kernels]") {
  k::conv2d_geometry g{2, 3, 3, 1, 1};
  tensor x = testing::random_tensor({5, 2, 6, 6}, 9), w = testing::random_tensor({3, 2, 3, 3}, 10);
  tensor y1, y2, cols, dw1, dw2, dx1, dx2;
  const k::context one = k::context::with_threads(1), two = k::context::with_threads(2);
  k::conv2d_forward(one, x, w, tensor(), g, y1, cols);
  k::conv2d_backward(one, x, w, cols, y1, g, &dx1, dw1, nullptr);
  k::conv2d_forward(two, x, w, tensor(), g, y2, cols);
  k::conv2d_backward(two, x, w, cols, y2, g, &dx2, dw2, nullptr);
  CHECK(y1.to_vector() == y2.to_vector());
  CHECK(dx1.to_vector() == dx2.to_vector());
  for (int64_t i = 0; i < dw1.numel(); ++i) CHECK(dw1.at(i) == Approx(dw2.at(i)).epsilon(1e-5));
}

TEST_CASE("two contexts with different thread counts run at once on two threads", "[kernels]") {
  // Large enough that GEMM and axpy split over the context's threads.
  const int64_t m = 96, n = 80, kk = 128, len = (int64_t{1} << 17) + 5;
  tensor a = testing::random_tensor({m, kk}, 21), b = testing::random_tensor({kk, n}, 22);
  const std::vector<double> want = naive_product(a, b, m, n, kk);
  std::vector<float> x(len);
  for (int64_t i = 0; i < len; ++i) x[i] = static_cast<float>(i % 11) - 5.0f;

  struct result {
    int64_t gemm_wrong = 0, axpy_wrong = 0;
  };
  auto run = [&](k::context c, result& r) {
    for (int rep = 0; rep < 20; ++rep) {
      tensor out;
      k::matmul(c, a, b, out);
      for (int64_t i = 0; i < m * n; ++i)
        r.gemm_wrong += std::abs(out.at(i) - want[i]) > 1e-3 * std::max(1.0, std::abs(want[i]));
      std::vector<float> y(len, 1.0f);
      k::axpy(c, len, 0.5f, x.data(), y.data());
      for (int64_t i = 0; i < len; ++i) r.axpy_wrong += y[i] != 1.0f + 0.5f * x[i];
    }
  };
  k::context one = k::context::with_threads(1), two = k::context::with_threads(2);
  one.gemm = two.gemm = GENERATE(k::gemm_backend::openblas, k::gemm_backend::eigen);
  result r1, r2;
  std::thread t1(run, one, std::ref(r1));
  std::thread t2(run, two, std::ref(r2));
  t1.join();
  t2.join();
  CHECK(r1.gemm_wrong == 0);
  CHECK(r1.axpy_wrong == 0);
  CHECK(r2.gemm_wrong == 0);
  CHECK(r2.axpy_wrong == 0);
}

TEST_CASE("a context's thread count: 0 is every core, a negative one is an error", "[kernels]") {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  CHECK(k::context::with_threads(0).threads == cores);
  CHECK(k::context::all_cores().threads == cores);
  CHECK(k::context::with_threads(3).threads == 3);
  CHECK(k::context{}.threads == 1);
  CHECK(k::context{}.gemm == k::gemm_backend::automatic);
  CHECK_THROWS_AS(k::context::with_threads(-1), error);
  CHECK_THROWS_WITH(k::context::with_threads(-2), Catch::Contains("-2") && Catch::Contains("0 for every core"));
  // A context filled in by hand is checked where the kernels use it.
  k::context zero;
  zero.threads = 0;
  std::vector<float> x(1 << 16, 1.0f), y(1 << 16, 0.0f);
  CHECK_THROWS_WITH(k::axpy(zero, 1 << 16, 1.0f, x.data(), y.data()), Catch::Contains("must be >= 1"));
}

TEST_CASE("all_finite finds a NaN or an Inf anywhere, on 1 to 3 threads", "[kernels]") {
  std::vector<float> v(100000, 0.5f);
  for (int threads : {1, 2, 3}) {
    INFO(threads << " thread(s)");
    const auto ctx = k::context::with_threads(threads);
    CHECK(k::all_finite(ctx, v.data(), static_cast<int64_t>(v.size())));
    for (std::size_t at : {std::size_t(0), v.size() / 2, v.size() - 1})
      for (float bad : {INFINITY, -INFINITY, NAN}) {
        v[at] = bad;
        CHECK_FALSE(k::all_finite(ctx, v.data(), static_cast<int64_t>(v.size())));
        v[at] = 0.5f;
      }
    v[5] = 3.4e38f;  // the largest floats are finite
    CHECK(k::all_finite(ctx, v.data(), static_cast<int64_t>(v.size())));
    v[5] = 0.5f;
  }
  CHECK(k::all_finite(k::context{}, v.data(), 0));
}

TEST_CASE("multi-tensor optimizer steps update every element once, as each tensor's own step", "[kernels][optim]") {
  // Sizes whose total is above the split grain, so that on two threads one thread's range ends inside a
  // tensor and the other's starts there; empty and one-element tensors between them.
  const std::vector<int64_t> sizes{3, 40000, 0, 1, 33000, 7001};
  const auto filled = [](int64_t n, float scale, float offset) {
    tensor t = tensor::zeros({n});
    for (int64_t i = 0; i < n; ++i) t.data()[i] = offset + scale * static_cast<float>((i * 7919) % 101 - 50) / 50.0f;
    return t;
  };
  const auto same_bits = [](const tensor& a, const tensor& b) {
    return a.numel() == b.numel() && std::equal(a.data(), a.data() + a.numel(), b.data());
  };
  struct param { tensor w, g, m, v; };
  const auto make = [&] {
    std::vector<param> ps;
    for (std::size_t i = 0; i < sizes.size(); ++i)
      ps.push_back({filled(sizes[i], 1.0f, 0.1f), filled(sizes[i], 0.5f, -0.05f), filled(sizes[i], 0.1f, 0.0f),
                    filled(sizes[i], 0.01f, 0.02f)});
    return ps;
  };
  const std::string rule = GENERATE("momentum", "nesterov", "adam", "adamw");
  const auto slots = [&](std::vector<param>& ps, bool two) {
    std::vector<k::update_slots> s;
    for (std::size_t i = 0; i < ps.size(); ++i)
      s.push_back({&ps[i].w, &ps[i].g, &ps[i].m, two ? &ps[i].v : nullptr, rule != "adamw" || i % 2 == 0});
    return s;
  };
  const int threads = GENERATE(1, 2);
  k::context c = ctx;
  c.threads = threads;
  std::vector<param> each = make(), all = make();
  for (int step = 1; step <= 2; ++step) {
    for (std::size_t i = 0; i < each.size(); ++i) {
      param& p = each[i];
      const float wd = rule == "adamw" && i % 2 != 0 ? 0.0f : 0.01f;  // adamw: odd-numbered parameters do not decay
      if (rule == "momentum" || rule == "nesterov")
        k::momentum_step(c, p.w, p.g, p.m, 0.1f, 0.9f, 0.01f, rule == "nesterov");
      else if (rule == "adam")
        k::adam_step(c, p.w, p.g, p.m, p.v, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, step);
      else
        k::adamw_step(c, p.w, p.g, p.m, p.v, 0.1f, 0.9f, 0.999f, 1e-8f, wd, step);
    }
    if (rule == "momentum" || rule == "nesterov")
      k::momentum_steps(c, slots(all, false), 0.1f, 0.9f, 0.01f, rule == "nesterov");
    else if (rule == "adam")
      k::adam_steps(c, slots(all, true), 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, step);
    else
      k::adamw_steps(c, slots(all, true), 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, step);
  }
  INFO(rule << " on " << threads << " threads");
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    INFO("parameter " << i << " of " << sizes[i] << " values");
    CHECK(same_bits(each[i].w, all[i].w));
    CHECK(same_bits(each[i].m, all[i].m));
    CHECK(same_bits(each[i].v, all[i].v));
  }
  // And against the formula, written out here: momentum's first element after two steps.
  if (rule == "momentum") {
    const param start = make()[1];
    double w = start.w.at(0), g = start.g.at(0), v = start.m.at(0);
    for (int step = 0; step < 2; ++step) {
      const double d = g + 0.01 * w;
      v = 0.9 * v + d;
      w -= 0.1 * v;
    }
    CHECK(all[1].w.at(0) == Approx(w).epsilon(1e-5));
    CHECK(all[1].m.at(0) == Approx(v).epsilon(1e-5));
  }
}

TEST_CASE("a multi-tensor step refuses parameters whose tensors differ in shape", "[kernels][optim]") {
  tensor w = tensor::zeros({4}), g = tensor::zeros({4}), v = tensor::zeros({5});
  CHECK_THROWS_WITH(k::momentum_steps(ctx, {{&w, &g, &v}}, 0.1f, 0.9f, 0.0f, false),
                    Catch::Contains("momentum_step") && Catch::Contains("velocity"));
  tensor m = tensor::zeros({4});
  CHECK_THROWS_WITH(k::adam_steps(ctx, {{&w, &g, &m, nullptr}}, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, 1),
                    Catch::Contains("adam_step") && Catch::Contains("missing"));
  CHECK(w.at(0) == 0.0f);
}
