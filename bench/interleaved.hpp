// Timing for the kernel benchmarks (conv, GEMM, elementwise): candidates take
// turns within each round, so that a slow phase of a shared machine falls on
// all of them; each candidate's median over the rounds. And the integer
// options of the kernel benchmarks' command lines.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace troupe::bench {

inline double seconds(const std::function<void()>& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Median time of each candidate over `reps` rounds, the candidates taking turns within a round;
/// before(i), when given, runs untimed just before each timed run of candidate i (to set the caches).
inline std::vector<double> median_interleaved(const std::vector<std::function<void()>>& fs, int reps,
                                              const std::function<void(std::size_t)>& before = {}) {
  std::vector<std::vector<double>> times(fs.size());
  for (auto& f : fs) f();  // warm-up: page faults, thread start, scratch and packing buffers
  for (int r = 0; r < reps; ++r)
    for (std::size_t i = 0; i < fs.size(); ++i) {
      if (before) before(i);
      times[i].push_back(seconds(fs[i]));
    }
  std::vector<double> out;
  for (auto& t : times) out.push_back(median(t));
  return out;
}

/// Reads `--name value` pairs into the integers of `flags`; an unknown name, or one without a value, prints
/// `usage` and exits with 2.
inline void parse_int_flags(int argc, char** argv, const std::vector<std::pair<std::string, int64_t*>>& flags,
                            const char* usage) {
  for (int i = 1; i < argc; i += 2) {
    auto f = std::find_if(flags.begin(), flags.end(), [&](const auto& p) { return p.first == argv[i]; });
    if (f == flags.end() || i + 1 == argc) {
      std::fprintf(stderr, "usage: %s\n", usage);
      std::exit(2);
    }
    *f->second = std::atoll(argv[i + 1]);
  }
}

} // namespace troupe::bench
