// GEMM throughput, every candidate in one run, as GFLOP/s and as a fraction of
// the machine's FMA peak measured in the same run (kernels::fma_peak_gflops):
// troupe's gemm on each backend (own, openblas, eigen), OpenBLAS called
// directly and Eigen's own product. Candidates take turns within each
// repetition (a slow phase of a shared machine hits all of them); the figures
// are medians over the repetitions. One JSON line per candidate and a summary.
//   troupe_gemm_bench [--size N] [--threads T] [--reps R]
// With --mlp (--products mlp), the eight products of the reference MLP's training
// step (784-256-128-10, batch 64); --products cnn and resnet, those of the
// CNN's, ResNet-20's and the gpt's steps that go through kernels::gemm: troupe's gemm on
// each backend (auto: the default's choice per product) against OpenBLAS's own
// threading; one JSON line per product and a total.
//   troupe_gemm_bench --mlp | --products MODEL [--threads T] [--reps R]
// With --peak, the FMA peak alone: 1 and T threads, every vector width the CPU has.
//   troupe_gemm_bench --peak [--threads T]
// With --balance, whether the cores run alike: R parallel regions of T threads,
// each thread the same FMA work (about 35 us, the size of one of the MLP's
// smaller products); each thread's median and 90th percentile, and the share of
// regions whose slowest thread took 1.25x the fastest's or more.
//   troupe_gemm_bench --balance [--threads T] [--reps R]
#include <cblas.h>
#include <immintrin.h>
#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench/interleaved.hpp"
#include "kernels/kernels.hpp"

namespace {

namespace k = troupe::kernels;

using troupe::bench::median;
using troupe::bench::median_interleaved;

/// The widest FMA width this CPU runs.
int widest() { return k::cpu().avx512f ? 16 : k::cpu().avx2 && k::cpu().fma ? 8 : 4; }

/// The FMA peak of `threads` threads at `width`: the median of 3 probes of 0.2 s.
double peak(int threads, int width) {
  std::vector<double> p;
  for (int i = 0; i < 3; ++i) p.push_back(k::fma_peak_gflops(threads, width, 0.2));
  return median(p);
}

int peak_lines(int threads) {
  std::vector<int> widths{4};
  if (k::cpu().avx2 && k::cpu().fma) widths.push_back(8);
  if (k::cpu().avx512f) widths.push_back(16);
  for (int t : {1, threads})
    for (int w : widths)
      std::printf("{\"bench\":\"fma_peak\",\"threads\":%d,\"width\":%d,\"gflops\":%.1f,\"kernels\":\"%s\"}\n", t, w,
                  peak(t, w), k::cpu_kernels_name().c_str());
  return 0;
}

k::context on(int threads, k::gemm_backend b) {
  k::context c = k::context::with_threads(threads);
  c.gemm = b;
  return c;
}

struct product {
  const char* name;
  bool ta, tb;
  int m, n, k;
};

/// A model's training-step products as the layers call kernels::gemm (logged from a step):
/// the MLP's as dense_forward/dense_backward call them (the first layer's input gradient is
/// skipped); the CNN's dense layers (3136 -> 128 -> 10); ResNet-20's classifier (64 -> 10) and its
/// two 1x1 projections' input gradients, one image at a time (conv2d_backward_data_gemm); the gpt's
/// dense products on a batch of 32 x 128 positions, one head's attention products and the products
/// of decoding one position (and four) with the keys and values kept.
std::vector<product> products_of(const std::string& model) {
  if (model == "mlp")
    return {{"fwd1", false, true, 64, 256, 784}, {"fwd2", false, true, 64, 128, 256}, {"fwd3", false, true, 64, 10, 128},
            {"dw3", true, false, 10, 128, 64},   {"dx3", false, false, 64, 128, 10},  {"dw2", true, false, 128, 256, 64},
            {"dx2", false, false, 64, 256, 128}, {"dw1", true, false, 256, 784, 64}};
  if (model == "cnn")
    return {{"fwd1", false, true, 64, 128, 3136}, {"fwd2", false, true, 64, 10, 128},  {"dw2", true, false, 10, 128, 64},
            {"dx2", false, false, 64, 128, 10},   {"dw1", true, false, 128, 3136, 64}, {"dx1", false, false, 64, 3136, 128}};
  if (model == "resnet")
    return {{"fwd", false, true, 64, 10, 64},      {"dw", true, false, 10, 64, 64},      {"dx", false, false, 64, 64, 10},
            {"proj2_dx", true, false, 16, 196, 32}, {"proj3_dx", true, false, 32, 49, 64}};
  if (model == "gpt")  // the default gpt (128 features, 4 heads, batch 32 x 128 positions) and its decoding (1 row)
    return {{"qkv", false, true, 4096, 384, 128},      {"mlp_up", false, true, 4096, 512, 128},
            {"mlp_down", false, true, 4096, 128, 512}, {"qkv_dw", true, false, 384, 128, 4096},
            {"qkv_dx", false, false, 4096, 128, 384},  {"scores", false, true, 128, 128, 32},
            {"pv", false, false, 128, 32, 128},        {"decode_qkv", false, true, 1, 384, 128},
            {"decode_down", false, true, 1, 128, 512}, {"decode_scores", false, true, 1, 128, 32},
            {"decode4_qkv", false, true, 4, 384, 128}};
  return {};
}

/// The products of `model`'s step: troupe's gemm on each backend (auto: as the default chooses) against
/// OpenBLAS's own threading.
int model_products(const std::string& model, int threads, int reps) {
  const std::vector<product> ps = products_of(model);
  if (ps.empty()) {
    std::fprintf(stderr, "troupe_gemm_bench: --products takes mlp, cnn, resnet or gpt, not %s\n", model.c_str());
    return 2;
  }
  std::size_t most = 0;
  for (const product& p : ps) most = std::max<std::size_t>(most, std::size_t(std::max({p.m, p.n})) * p.k + p.m * p.n);
  std::vector<float> a(most, 0.01f), b(most, 0.02f), c(most);
  const k::context own = on(threads, k::gemm_backend::own), blas = on(threads, k::gemm_backend::openblas),
                   automatic = on(threads, k::gemm_backend::automatic);
  double total_own = 0, total_troupe_blas = 0, total_blas = 0, total_auto = 0, flops = 0;
  const std::string tag = model == "mlp" ? "gemm_mlp" : "gemm_" + model;
  for (const product& p : ps) {
    const int lda = p.ta ? p.m : p.k, ldb = p.tb ? p.k : p.n;
    auto troupe = [&](const k::context& ctx) {
      k::gemm(ctx, p.ta, p.tb, p.m, p.n, p.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), p.n);
    };
    std::vector<double> t = median_interleaved(
        {[&] { troupe(own); }, [&] { troupe(blas); },
         [&] {
           cblas_sgemm(CblasRowMajor, p.ta ? CblasTrans : CblasNoTrans, p.tb ? CblasTrans : CblasNoTrans, p.m, p.n,
                       p.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), p.n);
         },
         [&] { troupe(automatic); }},
        reps);
    total_own += t[0];
    total_troupe_blas += t[1];
    total_blas += t[2];
    total_auto += t[3];
    const double flop = 2.0 * p.m * p.n * p.k;
    flops += flop;
    std::printf("{\"bench\":\"%s\",\"product\":\"%s\",\"m\":%d,\"n\":%d,\"k\":%d,\"threads\":%d,"
                "\"own_us\":%.2f,\"troupe_openblas_us\":%.2f,\"openblas_us\":%.2f,\"auto_us\":%.2f,"
                "\"own_gflops\":%.1f,\"troupe_openblas_gflops\":%.1f,\"openblas_gflops\":%.1f}\n",
                tag.c_str(), p.name, p.m, p.n, p.k, threads, t[0] * 1e6, t[1] * 1e6, t[2] * 1e6, t[3] * 1e6,
                flop / t[0] / 1e9, flop / t[1] / 1e9, flop / t[2] / 1e9);
  }
  const double pk = peak(threads, widest());
  std::printf("{\"bench\":\"%s_total\",\"threads\":%d,\"kernels\":\"%s\",\"own_us\":%.1f,"
              "\"troupe_openblas_us\":%.1f,\"openblas_us\":%.1f,\"auto_us\":%.1f,\"own_vs_troupe_openblas\":%.3f,"
              "\"own_vs_openblas\":%.3f,\"auto_vs_troupe_openblas\":%.3f,\"peak_gflops\":%.1f,\"own_of_peak\":%.3f,"
              "\"troupe_openblas_of_peak\":%.3f,\"auto_of_peak\":%.3f}\n",
              tag.c_str(), threads, k::cpu_kernels_name().c_str(), total_own * 1e6, total_troupe_blas * 1e6,
              total_blas * 1e6, total_auto * 1e6, total_troupe_blas / total_own, total_blas / total_own,
              total_troupe_blas / total_auto, pk, flops / total_own / 1e9 / pk, flops / total_troupe_blas / 1e9 / pk,
              flops / total_auto / 1e9 / pk);
  return 0;
}

int square(int n, int threads, int reps) {
  Eigen::setNbThreads(threads);
  using mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  mat a = mat::Random(n, n), b = mat::Random(n, n), c = mat::Zero(n, n);
  const double flop = 2.0 * n * n * n;
  auto troupe = [&](k::gemm_backend be) {
    return [&, be] { k::gemm(on(threads, be), false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n); };
  };
  const char* names[] = {"troupe_own", "troupe_openblas", "troupe_eigen", "openblas", "eigen"};
  const double peak_before = peak(threads, widest());
  std::vector<double> t = median_interleaved(
      {troupe(k::gemm_backend::own), troupe(k::gemm_backend::openblas), troupe(k::gemm_backend::eigen),
       [&] {
         cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
                     c.data(), n);
       },
       [&] { c.noalias() = a * b; }},
      reps);
  const double pk = 0.5 * (peak_before + peak(threads, widest()));
  for (std::size_t i = 0; i < t.size(); ++i)
    std::printf("{\"bench\":\"gemm\",\"size\":%d,\"threads\":%d,\"candidate\":\"%s\",\"gflops\":%.1f,"
                "\"of_peak\":%.3f}\n",
                n, threads, names[i], flop / t[i] / 1e9, flop / t[i] / 1e9 / pk);
  std::printf("{\"bench\":\"gemm_summary\",\"size\":%d,\"threads\":%d,\"kernels\":\"%s\",\"peak_gflops\":%.1f,"
              "\"own_of_peak\":%.3f,\"own_vs_openblas\":%.3f,\"own_vs_eigen\":%.3f}\n",
              n, threads, k::cpu_kernels_name().c_str(), pk, flop / t[0] / 1e9 / pk, t[3] / t[0], t[4] / t[0]);
  return 0;
}

/// Identical FMA work: 12 chains of 256-bit FMAs, `iters` deep.
__attribute__((target("avx2,fma"))) float fma_work(int64_t iters) {
  __m256 acc[12];
  for (int j = 0; j < 12; ++j) acc[j] = _mm256_set1_ps(1.0f + 1e-3f * static_cast<float>(j));
  const __m256 m = _mm256_set1_ps(0.999999f), d = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < 12; ++j) acc[j] = _mm256_fmadd_ps(acc[j], m, d);
  for (int j = 1; j < 12; ++j) acc[0] = _mm256_add_ps(acc[0], acc[j]);
  return _mm256_cvtss_f32(acc[0]);
}

int balance(int threads, int regions) {
  if (!(k::cpu().avx2 && k::cpu().fma)) {
    std::fprintf(stderr, "troupe_gemm_bench --balance: this CPU has no AVX2 + FMA\n");
    return 2;
  }
  std::vector<std::vector<double>> us(static_cast<std::size_t>(threads), std::vector<double>(regions));
  int uneven = 0;
  for (int r = 0; r < regions; ++r) {
#pragma omp parallel num_threads(threads)
    {
      const auto t0 = std::chrono::steady_clock::now();
      const float x = fma_work(20000);
      us[static_cast<std::size_t>(omp_get_thread_num())][r] =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      if (x == 12345.0f) std::printf("%f\n", x);  // never: the result is used, so the work runs
    }
    double lo = 1e300, hi = 0;
    for (int t = 0; t < threads; ++t) lo = std::min(lo, us[t][r]), hi = std::max(hi, us[t][r]);
    uneven += hi >= 1.25 * lo;
  }
  for (int t = 0; t < threads; ++t) {
    std::vector<double> v = us[static_cast<std::size_t>(t)];
    std::sort(v.begin(), v.end());
    std::printf("{\"bench\":\"balance\",\"thread\":%d,\"median_us\":%.1f,\"p90_us\":%.1f}\n", t, v[v.size() / 2],
                v[v.size() * 9 / 10]);
  }
  std::printf("{\"bench\":\"balance_summary\",\"threads\":%d,\"regions\":%d,\"uneven_share\":%.3f}\n", threads,
              regions, static_cast<double>(uneven) / regions);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  int n = 1024, threads = 2, reps = 10;
  bool peak_only = false, balance_only = false;
  std::string model;
  for (int i = 1; i < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--mlp" || a == "--peak" || a == "--balance") {
      if (a == "--mlp") model = "mlp";
      else if (a == "--peak") peak_only = true;
      else balance_only = true;
      --i;
    } else if (i + 1 >= argc) {
      std::fprintf(stderr, "troupe_gemm_bench: %s needs a value\n", a.c_str());
      return 2;
    } else if (a == "--size") n = std::atoi(argv[i + 1]);
    else if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
    else if (a == "--products") model = argv[i + 1];
    else {
      std::fprintf(stderr,
                   "usage: troupe_gemm_bench [--mlp | --products mlp|cnn|resnet|gpt | --peak | --balance] [--size N] [--threads T] "
                   "[--reps R]\n");
      return 2;
    }
  }
  openblas_set_num_threads(threads);
  if (peak_only) return peak_lines(threads);
  if (balance_only) return balance(threads, reps * 300);
  if (!model.empty()) return model_products(model, threads, reps * 100);
  return square(n, threads, reps);
}
