// The FMA peak probe: independent chains of fused multiply-adds, as many as
// hide the FMA latency on the CPUs troupe runs on, each loop compiled for its
// own instruction set (target attributes), so that the probe needs no
// -march flag and runs the widths the CPU has.
#include <omp.h>

#include <chrono>
#include <cstdint>
#include <string>

#include <immintrin.h>

#include "kernels/machine.hpp"
#include "tensor/error.hpp"

namespace troupe::kernels {

namespace {

/// Independent accumulators per thread: more than latency x throughput (4 x 2 on Zen, 4 x 2 on Intel cores).
constexpr int chains = 12;

#define TROUPE_FMA_LOOP(VEC, SET1, FMA, ADD, STORE, LANES)              \
  VEC acc[chains];                                                      \
  for (int j = 0; j < chains; ++j) acc[j] = SET1(1.0f + 1e-3f * j);     \
  const VEC m = SET1(0.999999f), d = SET1(1e-7f);                       \
  for (int64_t i = 0; i < iters; ++i) {                                 \
    _Pragma("GCC unroll 12") for (int j = 0; j < chains; ++j) acc[j] = FMA(acc[j], m, d); \
  }                                                                     \
  for (int j = 1; j < chains; ++j) acc[0] = ADD(acc[0], acc[j]);        \
  float out[LANES];                                                     \
  STORE(out, acc[0]);                                                   \
  return out[0];

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("fma"))) float fma_loop_4(int64_t iters) {
  TROUPE_FMA_LOOP(__m128, _mm_set1_ps, _mm_fmadd_ps, _mm_add_ps, _mm_storeu_ps, 4)
}
__attribute__((target("avx2,fma"))) float fma_loop_8(int64_t iters) {
  TROUPE_FMA_LOOP(__m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_storeu_ps, 8)
}
__attribute__((target("avx512f"))) float fma_loop_16(int64_t iters) {
  TROUPE_FMA_LOOP(__m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_storeu_ps, 16)
}
#endif
#undef TROUPE_FMA_LOOP

using loop_fn = float (*)(int64_t);

loop_fn loop_for(int width) {
  const cpu_features& f = cpu();
#if defined(__x86_64__) || defined(__i386__)
  if (width == 4 && f.fma) return fma_loop_4;
  if (width == 8 && f.avx2 && f.fma) return fma_loop_8;
  if (width == 16 && f.avx512f) return fma_loop_16;
#endif
  throw error("fma_peak_gflops: width " + std::to_string(width) +
              " is not one this CPU runs FMAs at; give 4 (FMA), 8 (AVX2 + FMA) or 16 (AVX-512F) where it has them");
}

/// Where a result no run can give would go: the loops' results are used, so they run.
volatile float sink = 0;

/// Seconds for `threads` threads to run `iters` iterations each.
double timed(loop_fn loop, int threads, int64_t iters) {
  const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
  {
    const float r = loop(iters);
    if (r == 12345.0f) sink = r;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

} // namespace

double fma_peak_gflops(int threads, int width, double seconds) {
  if (threads < 1) throw error("fma_peak_gflops: threads is " + std::to_string(threads) + "; give 1 or more");
  if (!(seconds > 0 && seconds <= 10))
    throw error("fma_peak_gflops: duration " + std::to_string(seconds) + " s; give one in (0, 10]");
  const loop_fn loop = loop_for(width);
  // Calibrate on a short run (threads started, clocks up), then run for about `seconds`.
  int64_t iters = 1 << 14;
  double t = timed(loop, threads, iters);
  while (t < seconds / 20) t = timed(loop, threads, iters *= 4);
  iters = static_cast<int64_t>(iters * seconds / t) + 1;
  t = timed(loop, threads, iters);
  return 2.0 * chains * width * static_cast<double>(iters) * threads / t / 1e9;
}

} // namespace troupe::kernels
