// troupe's own SGEMM (gemm_backend::own) on every kernel set this CPU runs,
// against a double-precision product; the machine probe; training with it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/gemm_own.hpp"
#include "kernels/cpu/simd_set.hpp"
#include "kernels/kernels.hpp"
#include "model/nn.hpp"
#include "model/optimizer.hpp"
#include "model/zoo.hpp"
#include "tests/gradcheck.hpp"

using namespace troupe;
namespace k = troupe::kernels;
using k::detail::gemm_kernel_set;

namespace {

std::vector<const gemm_kernel_set*> kernel_sets() {
  int n = 0;
  const gemm_kernel_set* const* s = k::detail::runnable_gemm_kernels(n);
  return {s, s + n};
}

struct dims {
  int64_t m, n, k;
};

/// One product with padded leading dimensions (pad columns past each
/// matrix's width hold a sentinel that must survive in C), checked element by
/// element against a double-precision product: |error| <= 4 (k + 2) eps
/// (|alpha| sum_p |a_ip b_pj| + |beta c_ij|), the usual bound for float32
/// sums of k products.
void check_product(const gemm_kernel_set& ks, int threads, bool ta, bool tb, dims d, float alpha, float beta,
                   int pad = 3) {
  const int64_t ar = ta ? d.k : d.m, ac = ta ? d.m : d.k, br = tb ? d.n : d.k, bc = tb ? d.k : d.n;
  const int64_t lda = ac + pad, ldb = bc + pad, ldc = d.n + pad;
  std::mt19937 rng(static_cast<unsigned>(d.m * 131 + d.n * 17 + d.k + ta * 2 + tb));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> a(static_cast<size_t>(std::max<int64_t>(1, ar * lda))), b(std::max<int64_t>(1, br * ldb));
  std::vector<float> c(static_cast<size_t>(d.m * ldc));
  for (float& x : a) x = u(rng);
  for (float& x : b) x = u(rng);
  const float sentinel = 7.5f, nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t i = 0; i < d.m; ++i)
    for (int64_t j = 0; j < ldc; ++j) c[i * ldc + j] = j >= d.n ? sentinel : beta == 0.0f ? nan : u(rng);
  const std::vector<float> c0 = c;
  k::detail::gemm_own(ks, threads, ta, tb, d.m, d.n, d.k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
  const double eps = std::numeric_limits<float>::epsilon();
  int64_t wrong = 0;
  for (int64_t i = 0; i < d.m; ++i) {
    for (int64_t j = d.n; j < ldc; ++j) wrong += c[i * ldc + j] != sentinel;
    for (int64_t j = 0; j < d.n; ++j) {
      double s = 0, mag = 0;
      for (int64_t p = 0; p < d.k; ++p) {
        const double x = ta ? a[p * lda + i] : a[i * lda + p], y = tb ? b[j * ldb + p] : b[p * ldb + j];
        s += x * y;
        mag += std::abs(x * y);
      }
      const double c_in = beta == 0.0f ? 0.0 : c0[i * ldc + j];
      const double want = alpha * s + beta * c_in;
      const double bound = 4 * (d.k + 2) * eps * (std::abs(alpha) * mag + std::abs(beta * c_in)) + 1e-30;
      const bool ok = std::abs(c[i * ldc + j] - want) <= bound;  // false for NaN
      if (!ok && wrong < 3) UNSCOPED_INFO("at " << i << "," << j << ": " << c[i * ldc + j] << " want " << want);
      wrong += !ok;
    }
  }
  INFO(ks.name << " threads " << threads << " ta " << ta << " tb " << tb << " m " << d.m << " n " << d.n << " k "
               << d.k << " alpha " << alpha << " beta " << beta);
  CHECK(wrong == 0);
}

} // namespace

TEST_CASE("own gemm: every transpose, odd and tiny sizes, against a double product", "[kernels][gemm][gemm_own]") {
  const std::vector<dims> shapes{{1, 1, 1},   {1, 7, 3},   {7, 1, 5},    {7, 17, 33}, {17, 33, 7},
                                 {33, 7, 17}, {6, 16, 8},  {12, 32, 64}, {13, 31, 9}, {100, 100, 100},
                                 {5, 40, 1},  {64, 10, 128}, {64, 128, 10}};
  for (const gemm_kernel_set* ks : kernel_sets())
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (dims d : shapes) check_product(*ks, 1, ta, tb, d, 1.0f, 0.0f);
}

TEST_CASE("own gemm: alpha and beta, beta 0 never reads C (NaN there stays out)", "[kernels][gemm][gemm_own]") {
  const std::pair<float, float> scalars[] = {{1.0f, 0.0f}, {0.5f, 0.0f}, {1.0f, 1.0f}, {-2.0f, 0.25f}, {0.75f, -1.0f}};
  for (const gemm_kernel_set* ks : kernel_sets())
    for (auto [alpha, beta] : scalars)
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          check_product(*ks, 1, ta, tb, {19, 35, 23}, alpha, beta);
          check_product(*ks, 2, ta, tb, {70, 90, 300}, alpha, beta, 17);
        }
}

TEST_CASE("own gemm: k = 0 and alpha = 0 give beta times C", "[kernels][gemm][gemm_own]") {
  for (const gemm_kernel_set* ks : kernel_sets()) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> c{1, 2, 3, 4, 5, 6}, a{nan, nan, nan}, b{nan, nan, nan};
    k::detail::gemm_own(*ks, 1, false, false, 2, 3, 0, 1.0f, a.data(), 1, b.data(), 3, 2.0f, c.data(), 3);
    CHECK(c == std::vector<float>{2, 4, 6, 8, 10, 12});
    k::detail::gemm_own(*ks, 1, false, false, 2, 3, 1, 0.0f, a.data(), 1, b.data(), 3, 0.5f, c.data(), 3);
    CHECK(c == std::vector<float>{1, 2, 3, 4, 5, 6});
    std::vector<float> z(6, nan);
    k::detail::gemm_own(*ks, 1, false, false, 2, 3, 0, 1.0f, a.data(), 1, b.data(), 3, 0.0f, z.data(), 3);
    CHECK(z == std::vector<float>(6, 0.0f));
  }
}

TEST_CASE("own gemm: blocked and threaded, several cache blocks deep and wide, 1 to 3 threads",
          "[kernels][gemm][gemm_own]") {
  // Beyond one block of every loop (k past kc, m past mc, n split among threads), uneven everywhere, and the
  // MLP's shapes; strides larger than the widths.
  const int threads = GENERATE(1, 2, 3);
  for (const gemm_kernel_set* ks : kernel_sets())
    for (dims d : {dims{301, 37, 97}, dims{37, 301, 97}, dims{150, 133, 20}, dims{64, 256, 784}, dims{257, 203, 1100},
                   dims{700, 65, 40}})
      for (bool ta : {false, true})
        for (bool tb : {false, true}) check_product(*ks, threads, ta, tb, d, 1.0f, d.k == 20 ? 1.0f : 0.0f, 5);
}

TEST_CASE("own gemm: the same bits on 1, 2 and 3 threads", "[kernels][gemm][gemm_own]") {
  // The MLP's products and a larger one: whichever thread computes an element, it sums the same slices of kc
  // in the same order (the training step's bits do not depend on --threads).
  for (const gemm_kernel_set* ks : kernel_sets())
    for (dims d : {dims{64, 256, 784}, dims{784, 256, 64}, dims{256, 784, 64}, dims{37, 301, 97}, dims{520, 600, 1000}})
      for (bool t : {false, true}) {
        INFO(ks->name << " m " << d.m << " n " << d.n << " k " << d.k << " transposed " << t);
        const tensor a = testing::random_tensor({d.m * d.k}, 31), b = testing::random_tensor({d.k * d.n}, 32);
        const int64_t lda = t ? d.m : d.k, ldb = t ? d.k : d.n;
        std::vector<float> one(static_cast<std::size_t>(d.m * d.n));
        k::detail::gemm_own(*ks, 1, t, t, d.m, d.n, d.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, one.data(), d.n);
        for (int threads : {2, 3}) {
          std::vector<float> got(one.size(), 1.0f);
          k::detail::gemm_own(*ks, threads, t, t, d.m, d.n, d.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, got.data(),
                              d.n);
          CHECK(std::memcmp(got.data(), one.data(), got.size() * 4) == 0);
        }
      }
}

TEST_CASE("gemm with the own backend: the public entry point, inside a parallel region too", "[kernels][gemm][gemm_own]") {
  k::context c2 = k::context::with_threads(2);
  c2.gemm = k::gemm_backend::own;
  tensor a = testing::random_tensor({70, 50}, 1), b = testing::random_tensor({50, 40}, 2), want, got;
  k::matmul(k::context::with_threads(1), a, b, want);
  k::matmul(c2, a, b, got);
  for (int64_t i = 0; i < want.numel(); ++i) CHECK(got.at(i) == Approx(want.at(i)).margin(1e-4));
  std::vector<tensor> outs(4);
#pragma omp parallel for num_threads(2)
  for (int t = 0; t < 4; ++t) k::matmul(c2, a, b, outs[t]);
  for (const tensor& o : outs)
    for (int64_t i = 0; i < want.numel(); ++i) CHECK(o.at(i) == Approx(want.at(i)).margin(1e-4));
}

TEST_CASE("the automatic backend takes the own kernels where they were measured faster", "[kernels][gemm][gemm_own]") {
  // Each product's bits are those of the backend chosen. Where 512-bit FMAs run at full rate and the avx512 set
  // runs: own for every product whose op(B) has 16 columns or more. Elsewhere: own for products of at least 64 each
  // way and at most 1024 deep (the MLP's first layer), OpenBLAS for the classifier, the CNN's 3136-deep forward
  // product and ResNet-20's 16 x 196 x 32 projection.
  const bool full_rate = k::cpu().full_rate_avx512 && k::cpu_kernels_name() == "avx512";
  const k::gemm_backend wide = full_rate ? k::gemm_backend::own : k::gemm_backend::openblas;
  struct shape_case {
    int64_t m, n, k;
    k::gemm_backend expected;
  };
  for (const shape_case& s : {shape_case{64, 256, 784, k::gemm_backend::own}, shape_case{128, 256, 1000, k::gemm_backend::own},
                              shape_case{64, 10, 128, k::gemm_backend::openblas}, shape_case{64, 128, 3136, wide},
                              shape_case{16, 196, 32, wide}}) {
    INFO(s.m << " x " << s.n << " x " << s.k);
    const tensor a = testing::random_tensor({s.m, s.k}, 3), b = testing::random_tensor({s.n, s.k}, 4);
    std::vector<float> got(static_cast<std::size_t>(s.m * s.n)), own(got.size()), blas(got.size());
    auto run = [&](k::gemm_backend be, std::vector<float>& c) {
      k::context ctx = k::context::with_threads(2);
      ctx.gemm = be;
      k::gemm(ctx, false, true, s.m, s.n, s.k, 1.0f, a.data(), s.k, b.data(), s.k, 0.0f, c.data(), s.n);
    };
    run(k::gemm_backend::automatic, got);
    run(k::gemm_backend::own, own);
    run(k::gemm_backend::openblas, blas);
    REQUIRE(own != blas);  // the two backends round differently here, so the check below tells them apart
    CHECK(got == (s.expected == k::gemm_backend::own ? own : blas));
  }
  CHECK(k::context{}.gemm == k::gemm_backend::automatic);
}

namespace {

/// The bits of a dense layer and the ReLU after it as two kernels: dense_forward, relu_forward; and
/// backward relu_backward, dense_backward.
struct dense_relu_reference {
  tensor y, g, dx, dw, db;
};

dense_relu_reference unfused_dense_relu(const k::context& ctx, const tensor& x, const tensor& w, const tensor& b,
                                        const tensor& dy) {
  dense_relu_reference r;
  tensor z;
  k::dense_forward(ctx, x, w, b, z);
  k::relu_forward(ctx, z, r.y);
  k::relu_backward(ctx, r.y, dy, r.g);
  k::dense_backward(ctx, x, w, r.g, &r.dx, r.dw, b.defined() ? &r.db : nullptr);
  return r;
}

bool same_bits(const tensor& a, const tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.numel()) * 4) == 0;
}

} // namespace

TEST_CASE("a dense layer's fused bias and ReLU give the bits of dense, then relu, on every backend and split",
          "[kernels][gemm][gemm_own]") {
  // Shapes on each side of the own kernels' thread split and of the automatic rule, with edge tiles; the
  // MLP's own. dy holds zeros and the forward's y holds zeros (ReLU's cut), so the mask matters.
  struct case_dims {
    int64_t n, in, out;
  };
  for (const case_dims d : {case_dims{64, 784, 256}, case_dims{64, 256, 128}, case_dims{37, 70, 45},
                            case_dims{3, 5, 7}, case_dims{64, 128, 10}, case_dims{130, 96, 200}})
    for (k::gemm_backend be : {k::gemm_backend::automatic, k::gemm_backend::own, k::gemm_backend::openblas,
                               k::gemm_backend::eigen})
      for (int threads : {1, 2, 3})
        for (bool bias : {true, false}) {
          INFO(d.n << " x " << d.in << " -> " << d.out << ", " << k::to_string(be) << ", " << threads
                   << " threads, bias " << bias);
          k::context ctx = k::context::with_threads(threads);
          ctx.gemm = be;
          const tensor x = testing::random_tensor({d.n, d.in}, 11), w = testing::random_tensor({d.out, d.in}, 12);
          const tensor b = bias ? testing::random_tensor({d.out}, 13) : tensor();
          tensor dy = testing::random_tensor({d.n, d.out}, 14);
          for (int64_t i = 0; i < dy.numel(); i += 7) dy.data()[i] = 0.0f;
          const dense_relu_reference want = unfused_dense_relu(ctx, x, w, b, dy);
          tensor y, dx, dw, db;
          k::dense_forward(ctx, x, w, b, y, true);
          REQUIRE(same_bits(y, want.y));
          int64_t zeros = 0;
          for (int64_t i = 0; i < y.numel(); ++i) zeros += y.at(i) == 0.0f;
          CHECK(zeros > 0);
          CHECK(zeros < y.numel());
          k::dense_backward(ctx, x, w, dy, &dx, dw, bias ? &db : nullptr, &y);
          CHECK(same_bits(dw, want.dw));
          CHECK(same_bits(dx, want.dx));
          if (bias) CHECK(same_bits(db, want.db));
        }
}

TEST_CASE("the own GEMM's epilogue: bias rows and an activation on every block, k = 0 too", "[kernels][gemm_own]") {
  for (const gemm_kernel_set* ks : kernel_sets())
    for (int threads : {1, 2, 4})
      for (const dims d : {dims{64, 256, 784}, dims{33, 70, 9}, dims{200, 130, 64}, dims{5, 6, 0}}) {
        INFO(ks->name << " threads " << threads << " m " << d.m << " n " << d.n << " k " << d.k);
        const tensor a = testing::random_tensor({d.m, std::max<int64_t>(d.k, 1)}, 21);
        const tensor b = testing::random_tensor({std::max<int64_t>(d.k, 1), d.n}, 22);
        const tensor bias = testing::random_tensor({d.n}, 23);
        const int64_t ldc = d.n + 2;
        std::vector<float> got(static_cast<std::size_t>(d.m * ldc), 9.0f), want = got;
        for (int64_t i = 0; i < d.m; ++i) std::copy_n(bias.data(), d.n, want.data() + i * ldc);
        k::detail::gemm_own(*ks, threads, false, false, d.m, d.n, d.k, 1.0f, a.data(), std::max<int64_t>(d.k, 1),
                            b.data(), d.n, 1.0f, want.data(), ldc);
        for (int64_t i = 0; i < d.m; ++i)
          k::detail::active_simd_kernels().relu_forward(want.data() + i * ldc, want.data() + i * ldc, d.n);
        k::detail::gemm_own(*ks, threads, false, false, d.m, d.n, d.k, 1.0f, a.data(), std::max<int64_t>(d.k, 1),
                            b.data(), d.n, 0.0f, got.data(), ldc,
                            {bias.data(), k::detail::active_simd_kernels().relu_forward});
        CHECK(std::memcmp(got.data(), want.data(), got.size() * 4) == 0);  // the padding columns untouched too
      }
}

TEST_CASE("gemm backends by name, and the kernel set is one the CPU runs", "[kernels][gemm_own]") {
  for (auto b : {k::gemm_backend::automatic, k::gemm_backend::openblas, k::gemm_backend::eigen, k::gemm_backend::own})
    CHECK(k::parse_gemm_backend(k::to_string(b)) == b);
  CHECK_THROWS_WITH(k::parse_gemm_backend("mkl"), Catch::Contains("'mkl'") && Catch::Contains("own"));
  const std::vector<std::string> sets = k::cpu_kernel_sets();
  REQUIRE(!sets.empty());
  CHECK(sets.back() == "generic");
  CHECK(std::find(sets.begin(), sets.end(), k::cpu_kernels_name()) != sets.end());
  if (k::cpu().avx512) CHECK(sets.front() == "avx512");
  else if (k::cpu().avx2 && k::cpu().fma) CHECK(sets.front() == "avx2+fma");
  CHECK(k::caches().l1d > 0);
  CHECK(k::caches().l2 >= k::caches().l1d);
}

TEST_CASE("cpuid's vendor, family and model are those the kernel reports", "[kernels][gemm_own]") {
  // /proc/cpuinfo's first processor: vendor_id, cpu family and model, as Linux decodes cpuid (extended fields
  // added). full_rate_avx512 is only ever claimed for the parts measured so.
  std::ifstream info("/proc/cpuinfo");
  std::string line, vendor;
  int family = -1, model = -1;
  while (std::getline(info, line) && !line.empty()) {  // "key<tabs>: value"
    const std::size_t colon = line.find(':');
    if (colon == std::string::npos || colon + 2 > line.size()) continue;
    const std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1), value = line.substr(colon + 2);
    if (key == "vendor_id") vendor = value;
    else if (key == "cpu family") family = std::stoi(value);
    else if (key == "model") model = std::stoi(value);
  }
  if (vendor.empty() || family < 0 || model < 0) {
    WARN("no x86 /proc/cpuinfo here: nothing to compare");
    return;
  }
  CHECK(k::cpu().vendor == vendor);
  CHECK(k::cpu().family == family);
  CHECK(k::cpu().model == model);
  if (k::cpu().full_rate_avx512)
    CHECK((k::cpu().avx512 && vendor == "AuthenticAMD" && family == 0x1a && model < 0x20));
}

TEST_CASE("TROUPE_CPU_KERNELS picks the GEMM and the vector kernels of the set it names", "[kernels][gemm_own]") {
  const char* cap = std::getenv("TROUPE_CPU_KERNELS");
  const std::string name = k::cpu_kernels_name();
  if (cap && *cap) CHECK(name == cap);
  else CHECK(name == k::cpu_kernel_sets().front());
  const k::detail::simd_kernel_set* want = name == "avx512"     ? &k::detail::avx512::simd_kernels()
                                           : name == "avx2+fma" ? &k::detail::avx2::simd_kernels()
                                                                : &k::detail::generic::simd_kernels();
  CHECK(&k::detail::active_simd_kernels() == want);
  const std::string gemm = k::detail::active_gemm_kernels().name;
  CHECK(gemm == name);
}

TEST_CASE("the FMA probe runs the widths the CPU has and refuses the others", "[kernels][peak]") {
  if (k::cpu().avx2 && k::cpu().fma) CHECK(k::fma_peak_gflops(1, 8, 0.01) > 0);
  if (k::cpu().avx512f) CHECK(k::fma_peak_gflops(2, 16, 0.01) > 0);
  else CHECK_THROWS_WITH(k::fma_peak_gflops(1, 16, 0.01), Catch::Contains("width 16"));
  CHECK_THROWS_WITH(k::fma_peak_gflops(1, 5, 0.01), Catch::Contains("width 5"));
  CHECK_THROWS_WITH(k::fma_peak_gflops(0, 8, 0.01), Catch::Contains("threads is 0"));
  CHECK_THROWS_WITH(k::fma_peak_gflops(1, 8, 0.0), Catch::Contains("duration"));
}

TEST_CASE("the MLP trains alike on the own and the OpenBLAS backend", "[kernels][gemm_own][model]") {
  // 200 steps of SGD with momentum on synthetic data: the losses agree to float rounding's drift, and
  // both learn the labels.
  tensor x = testing::random_tensor({64, 1, 28, 28}, 5);
  std::vector<int32_t> y(64);
  for (int i = 0; i < 64; ++i) y[i] = (x.at(i * 784) > 0) + 2 * (x.at(i * 784 + 500) > 0);
  std::vector<float> losses[2];
  int correct[2] = {};
  for (int which = 0; which < 2; ++which) {
    k::context c = k::context::with_threads(2);
    c.gemm = which == 0 ? k::gemm_backend::openblas : k::gemm_backend::own;
    auto net = zoo::mlp();
    net.build({1, 28, 28}, 11);
    auto opt = optim::sgd(0.02f).momentum(0.9f).make();
    tensor d;
    for (int step = 0; step < 200; ++step) {
      losses[which].push_back(k::softmax_cross_entropy(c, net.forward(c, x, true), y, &d));
      net.backward(c, d);
      opt->step(c, net.parameters());
    }
    correct[which] = static_cast<int>(k::count_correct(c, net.forward(c, x, false), y));
  }
  for (int s : {0, 1, 10, 50}) CHECK(losses[1][s] == Approx(losses[0][s]).epsilon(1e-3));
  CHECK(losses[1].back() < 0.1f * losses[1].front());
  CHECK(correct[1] >= 60);
  CHECK(correct[0] >= 60);
}
