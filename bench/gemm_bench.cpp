// GEMM throughput: troupe's gemm (default backend) against OpenBLAS called
// directly and Eigen's own product, in one run. Prints one JSON line.
//   troupe_gemm_bench [--size N] [--threads T] [--reps R]
#include <cblas.h>

#include <Eigen/Core>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/kernels.hpp"

namespace {

template <class F>
double best_seconds(F f, int reps) {
  f();  // warm-up: page faults, thread start
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
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
  troupe::kernels::set_num_threads(threads);
  using mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  mat a = mat::Random(n, n), b = mat::Random(n, n), c = mat::Zero(n, n);
  const double flop = 2.0 * n * n * n;

  double t_troupe = best_seconds([&] {
    troupe::kernels::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  }, reps);
  double t_blas = best_seconds([&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
                c.data(), n);
  }, reps);
  double t_eigen = best_seconds([&] { c.noalias() = a * b; }, reps);
  // troupe's gemm with its other backend, for the record.
  auto saved = troupe::kernels::get_gemm_backend();
  troupe::kernels::set_gemm_backend(saved == troupe::kernels::gemm_backend::openblas
                                        ? troupe::kernels::gemm_backend::eigen
                                        : troupe::kernels::gemm_backend::openblas);
  double t_other = best_seconds([&] {
    troupe::kernels::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  }, reps);
  troupe::kernels::set_gemm_backend(saved);

  const char* backend = troupe::kernels::get_gemm_backend() == troupe::kernels::gemm_backend::openblas ? "openblas" : "eigen";
  std::printf("{\"bench\":\"gemm\",\"size\":%d,\"threads\":%d,\"troupe_backend\":\"%s\",\"troupe_gflops\":%.1f,"
              "\"troupe_other_backend_gflops\":%.1f,\"openblas_gflops\":%.1f,\"eigen_gflops\":%.1f,"
              "\"troupe_vs_openblas\":%.3f}\n",
              n, threads, backend, flop / t_troupe / 1e9, flop / t_other / 1e9, flop / t_blas / 1e9, flop / t_eigen / 1e9, t_blas / t_troupe);
  return 0;
}
