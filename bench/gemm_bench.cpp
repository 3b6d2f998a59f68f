// GEMM throughput: troupe's gemm (default backend) against OpenBLAS called
// directly and Eigen's own product, in one run. Prints one JSON line.
//   troupe_gemm_bench [--size N] [--threads T] [--reps R]
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

} // namespace

int main(int argc, char** argv) {
  int n = 1024, threads = 2, reps = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--size") n = std::atoi(argv[i + 1]);
    else if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: troupe_gemm_bench [--size N] [--threads T] [--reps R]\n");
      return 2;
    }
  }
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
