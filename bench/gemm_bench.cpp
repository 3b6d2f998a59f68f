// GEMM throughput: troupe's gemm (default backend) against OpenBLAS called
// directly and Eigen's own product, in one run. Prints one JSON line.
//   troupe_gemm_bench [--size N] [--threads T] [--reps R]
// With --mlp, the eight products of the reference MLP's training step instead
// (784-256-128-10, batch 64): troupe's gemm, which cuts C into one block per
// thread, against OpenBLAS's own threading; one JSON line per product and a total.
//   troupe_gemm_bench --mlp [--threads T] [--reps R]
#include <cblas.h>

#include <Eigen/Core>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>
#include <string>

#include "kernels/kernels.hpp"

namespace {

double seconds(const std::function<void()>& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Best time of each candidate over `reps` rounds; the candidates take turns
/// within a round so that a slow phase of a shared machine hits all of them.
std::vector<double> best_interleaved(const std::vector<std::function<void()>>& fs, int reps) {
  std::vector<double> best(fs.size(), 1e30);
  for (auto& f : fs) f();  // warm-up: page faults, thread start
  for (int r = 0; r < reps; ++r)
    for (std::size_t i = 0; i < fs.size(); ++i) best[i] = std::min(best[i], seconds(fs[i]));
  return best;
}

struct product {
  const char* name;
  bool ta, tb;
  int m, n, k;
};

/// The MLP step's products as dense_forward/dense_backward call them (the first layer's input gradient is skipped).
int mlp_products(int threads, int reps) {
  namespace k = troupe::kernels;
  const k::context ctx = k::context::with_threads(threads);
  const product ps[] = {{"fwd1", false, true, 64, 256, 784},  {"fwd2", false, true, 64, 128, 256},
                        {"fwd3", false, true, 64, 10, 128},   {"dw3", true, false, 10, 128, 64},
                        {"dx3", false, false, 64, 128, 10},   {"dw2", true, false, 128, 256, 64},
                        {"dx2", false, false, 64, 256, 128},  {"dw1", true, false, 256, 784, 64}};
  std::vector<float> a(256 * 784, 0.01f), b(256 * 784, 0.02f), c(256 * 784);
  double total_troupe = 0, total_blas = 0;
  for (const product& p : ps) {
    const int lda = p.ta ? p.m : p.k, ldb = p.tb ? p.k : p.n;
    std::vector<double> t = best_interleaved(
        {[&] { k::gemm(ctx, p.ta, p.tb, p.m, p.n, p.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), p.n); },
         [&] {
           cblas_sgemm(CblasRowMajor, p.ta ? CblasTrans : CblasNoTrans, p.tb ? CblasTrans : CblasNoTrans, p.m, p.n,
                       p.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), p.n);
         }},
        reps);
    total_troupe += t[0];
    total_blas += t[1];
    const double flop = 2.0 * p.m * p.n * p.k;
    std::printf("{\"bench\":\"gemm_mlp\",\"product\":\"%s\",\"m\":%d,\"n\":%d,\"k\":%d,\"threads\":%d,"
                "\"troupe_us\":%.1f,\"openblas_us\":%.1f,\"troupe_gflops\":%.1f,\"openblas_gflops\":%.1f}\n",
                p.name, p.m, p.n, p.k, threads, t[0] * 1e6, t[1] * 1e6, flop / t[0] / 1e9, flop / t[1] / 1e9);
  }
  std::printf("{\"bench\":\"gemm_mlp_total\",\"threads\":%d,\"troupe_us\":%.1f,\"openblas_us\":%.1f,"
              "\"troupe_vs_openblas\":%.3f}\n",
              threads, total_troupe * 1e6, total_blas * 1e6, total_blas / total_troupe);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  int n = 1024, threads = 2, reps = 10;
  bool mlp = false;
  for (int i = 1; i < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--mlp") {
      mlp = true;
      --i;
    } else if (i + 1 >= argc) {
      std::fprintf(stderr, "troupe_gemm_bench: %s needs a value\n", a.c_str());
      return 2;
    } else if (a == "--size") n = std::atoi(argv[i + 1]);
    else if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: troupe_gemm_bench [--mlp] [--size N] [--threads T] [--reps R]\n");
      return 2;
    }
  }
  openblas_set_num_threads(threads);
  if (mlp) return mlp_products(threads, reps * 100);
  namespace k = troupe::kernels;
  // Each backend of troupe's gemm in its own context; OpenBLAS and Eigen called
  // directly get the same thread count through their own settings.
  const k::context mine = k::context::with_threads(threads);
  k::context other = mine;
  other.gemm = mine.gemm == k::gemm_backend::openblas ? k::gemm_backend::eigen : k::gemm_backend::openblas;
  openblas_set_num_threads(mine.threads);
  Eigen::setNbThreads(mine.threads);
  using mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  mat a = mat::Random(n, n), b_ = mat::Random(n, n), c = mat::Zero(n, n);
  const double flop = 2.0 * n * n * n;

  auto troupe_gemm = [&](const k::context& ctx) {
    k::gemm(ctx, false, false, n, n, n, 1.0f, a.data(), n, b_.data(), n, 0.0f, c.data(), n);
  };
  std::vector<double> t = best_interleaved(
      {[&] { troupe_gemm(mine); },
       [&] {
         cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b_.data(), n, 0.0f,
                     c.data(), n);
       },
       [&] { c.noalias() = a * b_; },
       // troupe's gemm with its other backend, for the record.
       [&] { troupe_gemm(other); }},
      reps);
  const double t_troupe = t[0], t_blas = t[1], t_eigen = t[2], t_other = t[3];

  const char* backend = mine.gemm == k::gemm_backend::openblas ? "openblas" : "eigen";
  std::printf("{\"bench\":\"gemm\",\"size\":%d,\"threads\":%d,\"troupe_backend\":\"%s\",\"troupe_gflops\":%.1f,"
              "\"troupe_other_backend_gflops\":%.1f,\"openblas_gflops\":%.1f,\"eigen_gflops\":%.1f,"
              "\"troupe_vs_openblas\":%.3f}\n",
              n, mine.threads, backend, flop / t_troupe / 1e9, flop / t_other / 1e9, flop / t_blas / 1e9, flop / t_eigen / 1e9, t_blas / t_troupe);
  return 0;
}
