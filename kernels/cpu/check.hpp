#pragma once

#include <omp.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "kernels/context.hpp"
#include "tensor/tensor.hpp"

namespace troupe::kernels::detail {

inline void require(bool ok, const char* kernel, const char* what) {
  if (!ok) throw shape_error(std::string(kernel) + ": " + what);
}

/// The same, with a message that names shapes or numbers: `what()` makes it,
/// only when the check fails (made on every call, such a message cost each
/// dense layer a few strings per step). A std::string does not compile here.
template <class What, class = decltype(std::string(std::declval<What&>()()))>
void require(bool ok, const char* kernel, What&& what) {
  if (!ok) throw shape_error(std::string(kernel) + ": " + what());
}

inline void require_shape(const tensor& t, const shape& want, const char* kernel, const char* arg) {
  if (!t.defined())
    throw shape_error(std::string(kernel) + ": " + arg + " is undefined, expected " + want.to_string());
  if (t.shape() != want)
    throw shape_error(std::string(kernel) + ": " + arg + " has shape " + t.shape().to_string() +
                      ", expected " + want.to_string());
}

inline void require_rank(const tensor& t, std::size_t rank, const char* kernel, const char* arg) {
  if (!t.defined() || t.rank() != rank)
    throw shape_error(std::string(kernel) + ": " + arg + " must have rank " + std::to_string(rank) +
                      ", got " + (t.defined() ? t.shape().to_string() : std::string("undefined")));
}

inline void require_same(const tensor& a, const tensor& b, const char* kernel, const char* an,
                         const char* bn) {
  if (!a.defined() || !b.defined() || a.shape() != b.shape())
    throw shape_error(std::string(kernel) + ": " + an + " " +
                      (a.defined() ? a.shape().to_string() : "undefined") + " and " + bn + " " +
                      (b.defined() ? b.shape().to_string() : "undefined") + " must have the same shape");
}

/// Minimum element count for which an elementwise loop is split over threads.
constexpr int64_t parallel_grain = 1 << 15;

/// ctx.threads, checked: the value of every parallel region's num_threads clause.
inline int threads(const context& ctx) {
  if (ctx.threads < 1)
    throw error("kernels: context.threads is " + std::to_string(ctx.threads) +
                "; it must be >= 1 (context::with_threads(0) gives every core)");
  return ctx.threads;
}

/// Threads of a loop over n images (one image per thread at a time): ctx's, at most n, at least 1.
inline int image_threads(const context& ctx, int64_t n) {
  return std::max(1, std::min<int>(threads(ctx), static_cast<int>(n)));
}

/// True when a loop over n elements is worth splitting over ctx's threads.
inline bool split(const context& ctx, int64_t n) { return threads(ctx) > 1 && n > parallel_grain; }

/// body(lo, hi) over [0, n): one contiguous range per thread of ctx when n is
/// large, else all on this thread. Each range is a plain loop the compiler
/// vectorizes (an `omp parallel for simd` loop ran ReLU's backward scalar, with
/// a mispredicted branch per element).
template <class B>
void parallel_ranges(const context& ctx, int64_t n, B body) {
  if (!split(ctx, n)) {
    body(int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(ctx.threads)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    body(n * t / nt, n * (t + 1) / nt);
  }
}

/// body(s, lo, hi) over [lo, hi) of segment s, for segments of the given
/// sizes laid end to end: the whole run is cut as parallel_ranges cuts one
/// range, so a thread's range may span several segments or part of one.
template <class B>
void parallel_segments(const context& ctx, const std::vector<int64_t>& sizes, B body) {
  int64_t n = 0;
  for (int64_t s : sizes) n += s;
  parallel_ranges(ctx, n, [&](int64_t lo, int64_t hi) {
    int64_t start = 0;
    for (std::size_t s = 0; s < sizes.size() && start < hi; start += sizes[s], ++s) {
      const int64_t a = std::max(lo, start), b = std::min(hi, start + sizes[s]);
      if (a < b) body(s, a - start, b - start);
    }
  });
}

} // namespace troupe::kernels::detail
