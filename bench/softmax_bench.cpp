// The attention's causal softmax per kernel set: each set's kernel
// (kernels/cpu/sequence_set.cpp) against the loop the library ran before
// ("old": main at 57fd959, kept below, compiled at the baseline like the
// library's files), on the GPT's probabilities: [pairs, T, T] with pairs =
// batch x heads (32 x 4) and T = 128, rows by blocks of 32 as
// attention_forward calls it, the pairs split over the threads as it splits
// them. Each timed call first copies the scores (uniform in [-4, 4]) into the
// matrices; "copy" is that alone. Candidates take turns within each round
// (bench/interleaved.hpp), each timed call after four untimed ones of the same
// candidate (8 MiB: in L3 on the machine of docs/benchmarks.md); medians over
// the rounds. One JSON line: each candidate's ms, ns per softmax entry (the
// copy's time taken off) and old / avx2+fma, avx2+fma / avx512 of those.
//   troupe_softmax_bench [--threads T] [--reps R] [--time T] [--pairs P]
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench/interleaved.hpp"
#include "kernels/cpu/simd_math.hpp"
#include "kernels/cpu/simd_set.hpp"

namespace {

namespace k = troupe::kernels;
namespace simd = troupe::kernels::simd;
using softmax_fn = void (*)(float* p, int64_t t_len, int64_t i0, int64_t i1);

/// 57fd959's causal_softmax (kernels/cpu/sequence.cpp): GCC kept the max and the exponential's loops scalar.
void old_causal_softmax(float* p, int64_t t_len, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    float* row = p + i * t_len;
    float mx = row[0];
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j <= i; ++j) mx = std::max(mx, row[j]);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j <= i; ++j) {
      row[j] = simd::exp_approx(row[j] - mx);
      sum += row[j];
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
    std::fill(row + i + 1, row + t_len, 0.0f);
  }
}

struct options {
  int64_t threads = 2, reps = 31, time = 128, pairs = 128;
};

options parse(int argc, char** argv) {
  options o;
  troupe::bench::parse_int_flags(
      argc, argv, {{"--threads", &o.threads}, {"--reps", &o.reps}, {"--time", &o.time}, {"--pairs", &o.pairs}},
      "troupe_softmax_bench [--threads T] [--reps R] [--time T] [--pairs P]");
  return o;
}

} // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  const int64_t t = o.time, size = t * t;
  std::vector<float> scores(static_cast<std::size_t>(o.pairs * size)), p(scores.size());
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> d(-4.0f, 4.0f);
  for (float& x : scores) x = d(rng);
  // The pairs over the threads; each pair's scores copied in, then softmax by blocks of 32 rows (none: copy only).
  auto run = [&](softmax_fn f) {
    return [&, f] {
#pragma omp parallel for schedule(static) num_threads(static_cast<int>(o.threads))
      for (int64_t pair = 0; pair < o.pairs; ++pair) {
        float* m = p.data() + pair * size;
        std::memcpy(m, scores.data() + pair * size, static_cast<std::size_t>(size) * sizeof(float));
        for (int64_t i0 = 0; f && i0 < t; i0 += 32) f(m, t, i0, std::min(t, i0 + 32));
      }
    };
  };
  std::vector<std::string> names{"copy", "old"};
  std::vector<std::function<void()>> fs{run(nullptr), run(old_causal_softmax)};
  for (const auto& [name, table] : k::detail::runnable_simd_kernels()) {
    names.push_back(name);
    fs.push_back(run(table->causal_softmax));
  }
  const std::vector<double> sec = troupe::bench::median_interleaved(fs, static_cast<int>(o.reps), [&](std::size_t i) {
    for (int w = 0; w < 4; ++w) fs[i]();
  });
  const double entries = static_cast<double>(o.pairs) * t * (t + 1) / 2;
  std::printf("{\"bench\":\"causal_softmax\",\"time\":%lld,\"pairs\":%lld,\"threads\":%lld,\"reps\":%lld",
              static_cast<long long>(t), static_cast<long long>(o.pairs), static_cast<long long>(o.threads),
              static_cast<long long>(o.reps));
  double old = 0, avx2 = 0, avx512 = 0;
  for (std::size_t i = 0; i < fs.size(); ++i) {
    const double net = sec[i] - sec[0];
    std::printf(",\"%s_ms\":%.4f", names[i].c_str(), sec[i] * 1e3);
    if (i > 0) std::printf(",\"%s_ns_per_entry\":%.3f", names[i].c_str(), net / entries * 1e9 * o.threads);
    if (names[i] == "old") old = net;
    if (names[i] == "avx2+fma") avx2 = net;
    if (names[i] == "avx512") avx512 = net;
  }
  if (avx2 > 0) std::printf(",\"old_over_avx2\":%.3f", old / avx2);
  if (avx512 > 0) std::printf(",\"avx2_over_avx512\":%.3f,\"old_over_avx512\":%.3f", avx2 / avx512, old / avx512);
  std::printf("}\n");
}
