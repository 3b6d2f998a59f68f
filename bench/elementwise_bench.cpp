// The elementwise kernels per kernel set (issue 25): each set's loop
// (kernels/cpu/elementwise_set.cpp) against the loop the library ran before
// the sets ("old": main at 4a343d6, kept below, compiled at the baseline like
// the library's files; for tanh and sigmoid forward, main's libm loop at
// 784be23; for all_finite and dropout_forward, main's loops at e613a43), on
// the tensors of the zoo's models, each call split over the threads as the
// kernels split it (detail::parallel_ranges); e613a43's dropout_forward ran on
// one thread whatever the context, and so does its "old" here.
// Candidates take turns within each round (bench/interleaved.hpp); medians over
// the rounds. Warm (the default): each timed call follows four untimed ones of
// the same candidate, which leave its arrays in the caches as far as they fit
// (L3: 32 MiB on the machine of docs/benchmarks.md; after one call, the first
// candidate after another kernel's arrays still ran up to 2x slower than the
// next, with the same loop). --cold 1: a write of 256 MiB comes before each
// timed call instead, so that the arrays come from memory. One JSON line per
// kernel: each candidate's ms and GB/s (inputs read and outputs written once),
// and old / avx2+fma, avx2+fma / avx512.
//   troupe_elementwise_bench [--threads T] [--reps R] [--elements N] [--only NAME] [--cold 1]
// --elements N runs every kernel on N floats instead (e.g. 65536: in L2).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench/interleaved.hpp"
#include "kernels/cpu/check.hpp"
#include "kernels/cpu/simd_math.hpp"
#include "kernels/cpu/simd_set.hpp"

namespace {

namespace k = troupe::kernels;
namespace simd = troupe::kernels::simd;
using set_table = k::detail::simd_kernel_set;
/// A loop over n floats of a (and b) into y.
using range_fn = std::function<void(const float* a, const float* b, float* y, int64_t n)>;

constexpr int64_t cnn_activation = 64 * 32 * 28 * 28;  // the CNN's first convolution's output, batch 64
constexpr int64_t gpt_hidden = 32 * 128 * 512;         // the GPT's MLP hidden layer: B 32, T 128, 4 x 128

// ---------------------------------------------------------------- 4a343d6's loops
constexpr float gelu_k = 0.7978845608028654f;
constexpr float gelu_c = 0.044715f;

void old_gelu_forward(const float* a, const float*, float* o, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = a[i];
    o[i] = 0.5f * v * (1.0f + simd::tanh_approx(gelu_k * (v + gelu_c * v * v * v)));
  }
}

void old_gelu_backward(const float* a, const float* g, float* o, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = a[i];
    const float t = simd::tanh_approx(gelu_k * (v + gelu_c * v * v * v));
    const float dinner = gelu_k * (1.0f + 3.0f * gelu_c * v * v);
    o[i] = g[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * dinner);
  }
}

// ---------------------------------------------------------------- e613a43's all_finite and dropout_forward

/// One thread's range of all_finite (its omp parallel region's body): 1 into y[0] where a float's exponent bits
/// are all ones.
void old_all_finite(const float* a, const float*, float* y, int64_t n) {
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(a);
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad |= static_cast<uint32_t>((bits[i] & 0x7f800000u) == 0x7f800000u);
  if (n > 0) y[0] = static_cast<float>(bad);
}

uint64_t old_splitmix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// The bench's dropout: p = 0.1 (keep 1 / 0.9), the mask into b's array (an input of the other kernels), y = a mask.
constexpr float dropout_p = 0.1f;
const uint64_t dropout_base = old_splitmix(7 ^ old_splitmix(3));
const uint64_t dropout_threshold = static_cast<uint64_t>(static_cast<double>(dropout_p) * 18446744073709551616.0);

void old_dropout(const float* a, const float* b, float* o, int64_t n) {
  const float keep = 1.0f / (1.0f - dropout_p);
  float* m = const_cast<float*>(b);
  for (int64_t i = 0; i < n; ++i) {
    m[i] = old_splitmix(dropout_base + static_cast<uint64_t>(i)) >= dropout_threshold ? keep : 0.0f;
    o[i] = a[i] * m[i];
  }
}

/// The old map1 and map2: a loop of f over one element (of a, or of a and b).
template <class F>
range_fn old_loop(F f) {
  return [f](const float* a, const float* b, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = f(a[i], b[i]);
  };
}

// ---------------------------------------------------------------- the cases

struct kernel_case {
  std::string name;
  int64_t elements;
  int inputs;
  range_fn old;
  std::function<range_fn(const set_table&)> of_set;
  int outputs = 1;
  bool old_on_one_thread = false;  ///< the old loop ignored the context's threads
};

range_fn unary(set_table::unary f) {
  return [f](const float* a, const float*, float* y, int64_t n) { f(a, y, n); };
}
range_fn binary(set_table::binary f) { return f; }
/// A range of dropout_forward, the mask into b's array; every range hashes from dropout_base (the kernel's
/// work, not its mask: the library hashes from base + the range's start).
std::function<void(const float*, const float*, float*, int64_t)> dropout_of(const set_table& s) {
  const float keep = 1.0f / (1.0f - dropout_p);
  return [f = s.dropout, keep](const float* a, const float* b, float* y, int64_t n) {
    f(a, dropout_base, dropout_threshold, keep, const_cast<float*>(b), y, n);
  };
}

std::vector<kernel_case> cases() {
  const int64_t c = cnn_activation;
  return {
      {"add", c, 2, old_loop([](float a, float b) { return a + b; }),
       [](const set_table& s) { return range_fn([f = s.add](auto a, auto b, auto y, auto n) { f(a, b, y, n, false); }); }},
      {"add_relu", c, 2, old_loop([](float a, float b) { return std::max(a + b, 0.0f); }),
       [](const set_table& s) { return range_fn([f = s.add](auto a, auto b, auto y, auto n) { f(a, b, y, n, true); }); }},
      {"relu_forward", c, 1, old_loop([](float v, float) { return std::max(v, 0.0f); }),
       [](const set_table& s) { return unary(s.relu_forward); }},
      {"relu_backward", c, 2, old_loop([](float v, float g) { return v > 0.0f ? g : 0.0f; }),
       [](const set_table& s) { return binary(s.relu_backward); }},
      // tanh and sigmoid forward before their sets (elementwise.cpp's map_each at 784be23): libm per element.
      {"tanh_forward", c, 1, old_loop([](float v, float) { return std::tanh(v); }),
       [](const set_table& s) { return unary(s.tanh_forward); }},
      {"sigmoid_forward", c, 1, old_loop([](float v, float) { return 1.0f / (1.0f + std::exp(-v)); }),
       [](const set_table& s) { return unary(s.sigmoid_forward); }},
      {"tanh_backward", c, 2, old_loop([](float v, float g) { return g * (1.0f - v * v); }),
       [](const set_table& s) { return binary(s.tanh_backward); }},
      {"sigmoid_backward", c, 2, old_loop([](float v, float g) { return g * v * (1.0f - v); }),
       [](const set_table& s) { return binary(s.sigmoid_backward); }},
      {"dropout_backward", c, 2, old_loop([](float m, float g) { return m * g; }),
       [](const set_table& s) { return binary(s.multiply); }},
      {"gelu_forward", gpt_hidden, 1, old_gelu_forward, [](const set_table& s) { return unary(s.gelu_forward); }},
      {"gelu_backward", gpt_hidden, 2, old_gelu_backward, [](const set_table& s) { return binary(s.gelu_backward); }},
      {"all_finite", c, 1, old_all_finite,
       [](const set_table& s) {
         return range_fn([f = s.all_finite](auto a, auto, auto y, auto n) { y[0] = static_cast<float>(!f(a, n)); });
       },
       0},
      {"dropout_forward", c, 1, old_dropout, [](const set_table& s) { return range_fn(dropout_of(s)); }, 2, true},
  };
}

std::vector<float> random_floats(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-4.0f, 4.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

struct options {
  int threads = 2, reps = 31;
  int64_t elements = 0;  ///< 0: each kernel's model size
  std::string only;
  bool cold = false;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") o.threads = std::atoi(argv[i + 1]);
    else if (a == "--reps") o.reps = std::atoi(argv[i + 1]);
    else if (a == "--elements") o.elements = std::atoll(argv[i + 1]);
    else if (a == "--only") o.only = argv[i + 1];
    else if (a == "--cold") o.cold = std::atoi(argv[i + 1]) != 0;
    else {
      std::fprintf(stderr, "usage: troupe_elementwise_bench [--threads T] [--reps R] [--elements N] [--only NAME] "
                           "[--cold 1]\n");
      std::exit(2);
    }
  }
  return o;
}

struct setup {
  kernel_case c;
  int64_t n;
  std::vector<float> a, b, y;
};

} // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  const k::context ctx = k::context::with_threads(o.threads), one = k::context::with_threads(1);
  const auto sets = k::detail::runnable_simd_kernels();
  std::vector<setup> ss;
  for (const kernel_case& c : cases()) {
    if (c.name.find(o.only) == std::string::npos) continue;
    const int64_t n = o.elements > 0 ? o.elements : c.elements;
    ss.push_back({c, n, random_floats(n, 1), random_floats(n, 2), std::vector<float>(n)});
  }
  // Per kernel: old, then each set, widest first.
  std::vector<std::function<void()>> fs;
  for (setup& s : ss) {
    std::vector<range_fn> candidates{s.c.old};
    for (const auto& set : sets) candidates.push_back(s.c.of_set(*set.second));
    for (std::size_t j = 0; j < candidates.size(); ++j) {
      const k::context* run_on = j == 0 && s.c.old_on_one_thread ? &one : &ctx;
      fs.push_back([&s, f = candidates[j], run_on] {
        k::detail::parallel_ranges(*run_on, s.n, [&](int64_t lo, int64_t hi) {
          f(s.a.data() + lo, s.b.data() + lo, s.y.data() + lo, hi - lo);
        });
      });
    }
  }
  std::vector<float> flush(64 << 20);
  const std::vector<double> t = troupe::bench::median_interleaved(fs, o.reps, [&](std::size_t i) {
    if (o.cold) {
      k::detail::parallel_ranges(ctx, static_cast<int64_t>(flush.size()),
                                 [&](int64_t lo, int64_t hi) { std::fill(flush.data() + lo, flush.data() + hi, 1.0f); });
      return;
    }
    for (int w = 0; w < 4; ++w) fs[i]();
  });
  const std::size_t per = 1 + sets.size();
  for (std::size_t i = 0; i < ss.size(); ++i) {
    const setup& s = ss[i];
    const double bytes = 4.0 * s.n * (s.c.inputs + s.c.outputs);
    std::printf("{\"bench\":\"elementwise\",\"kernel\":\"%s\",\"elements\":%lld,\"threads\":%d,\"reps\":%d,"
                "\"caches\":\"%s\"",
                s.c.name.c_str(), static_cast<long long>(s.n), o.threads, o.reps, o.cold ? "cold" : "warm");
    double avx2 = 0, avx512 = 0;
    for (std::size_t j = 0; j < per; ++j) {
      const std::string name = j == 0 ? "old" : sets[j - 1].first;
      const double sec = t[i * per + j];
      if (name == "avx2+fma") avx2 = sec;
      if (name == "avx512") avx512 = sec;
      std::printf(",\"%s_ms\":%.4f,\"%s_gbps\":%.1f", name.c_str(), sec * 1e3, name.c_str(), bytes / sec / 1e9);
    }
    if (avx2 > 0) std::printf(",\"old_over_avx2\":%.3f", t[i * per] / avx2);
    if (avx512 > 0) std::printf(",\"avx2_over_avx512\":%.3f,\"old_over_avx512\":%.3f", avx2 / avx512, t[i * per] / avx512);
    std::printf("}\n");
  }
}
