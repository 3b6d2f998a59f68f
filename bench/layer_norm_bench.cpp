// Layer norm per kernel set (issue 25): each set's loops (kernels/cpu/sequence_set.cpp, simd_set.hpp's
// layer_norm_forward, _backward and _params) against the loops the library ran before the sets ("old": main at
// e613a43, kept below, compiled at the baseline like the library's files), on the GPT's activations: [rows, cols]
// = [batch 32 x 128 tokens, 128 channels]. Three phases, as layer_norm_forward and layer_norm_backward run them:
// "forward" (the rows' mean, rstd and y), "backward_rows" (dx), "backward_params" (dgamma, dbeta: blocks of
// columns per thread); rows and columns split over the threads as sequence.cpp splits them. Candidates take
// turns within each round (bench/interleaved.hpp), each timed call after four untimed ones of the same candidate
// (2 MiB an array: in L2 and L3 on the machine of docs/benchmarks.md); medians over the rounds. One JSON line a
// phase: each candidate's us, and old / avx2+fma, avx2+fma / avx512. Every candidate's outputs are compared
// with the old loops' bit for bit first ("same_bits").
//   troupe_layer_norm_bench [--threads T] [--reps R] [--rows N] [--cols C]
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench/interleaved.hpp"
#include "kernels/cpu/simd_set.hpp"

namespace {

namespace k = troupe::kernels;
using k::detail::layer_norm_args;

// ---------------------------------------------------------------- e613a43's loops (kernels/cpu/sequence.cpp)

float row_mean(const float* x, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += x[i];
  return s / static_cast<float>(n);
}

float row_rstd(const float* x, int64_t n, float mean, float eps) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += (x[i] - mean) * (x[i] - mean);
  return 1.0f / std::sqrt(s / static_cast<float>(n) + eps);
}

/// Rows [r0, r1) of the forward pass's `omp parallel for` loop.
void old_forward(const layer_norm_args& a, int64_t r0, int64_t r1, float* y, float* mean, float* rstd) {
  const float *gp = a.gamma, *bp = a.beta;
  const int64_t cols = a.cols;
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = a.x + r * cols;
    float* yr = y + r * cols;
    const float m = row_mean(xr, cols), s = row_rstd(xr, cols, m, a.eps);
    mean[r] = m;
    rstd[r] = s;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - m) * s * gp[c] + (bp ? bp[c] : 0.0f);
  }
}

void old_row_backward(const float* x, const float* dy, const float* gamma, float mean, float rstd, int64_t n,
                      float* dx) {
  float sg = 0.0f, sgx = 0.0f;
#pragma omp simd reduction(+ : sg, sgx)
  for (int64_t i = 0; i < n; ++i) {
    const float g = dy[i] * gamma[i];
    sg += g;
    sgx += g * (x[i] - mean) * rstd;
  }
  const float mg = sg / static_cast<float>(n), mgx = sgx / static_cast<float>(n);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dx[i] = rstd * (dy[i] * gamma[i] - mg - (x[i] - mean) * rstd * mgx);
}

void old_backward(const layer_norm_args& a, int64_t r0, int64_t r1, float* dx) {
  for (int64_t r = r0; r < r1; ++r)
    old_row_backward(a.x + r * a.cols, a.dy + r * a.cols, a.gamma, a.mean[r], a.rstd[r], a.cols, dx + r * a.cols);
}

void old_params(const layer_norm_args& a, int64_t lo, int64_t hi, float* dgamma, float* dbeta) {
  std::vector<double> sg(static_cast<std::size_t>(hi - lo), 0.0), sb(sg.size(), 0.0);
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* xr = a.x + r * a.cols;
    const float* gr = a.dy + r * a.cols;
    const float m = a.mean[r], s = a.rstd[r];
    for (int64_t c = lo; c < hi; ++c) {
      sg[c - lo] += double(gr[c]) * ((xr[c] - m) * s);
      sb[c - lo] += gr[c];
    }
  }
  for (int64_t c = lo; c < hi; ++c) {
    dgamma[c] = static_cast<float>(sg[c - lo]);
    dbeta[c] = static_cast<float>(sb[c - lo]);
  }
}

// ---------------------------------------------------------------- the runs

struct options {
  int64_t threads = 2, reps = 31, rows = 32 * 128, cols = 128;
};

options parse(int argc, char** argv) {
  options o;
  troupe::bench::parse_int_flags(
      argc, argv, {{"--threads", &o.threads}, {"--reps", &o.reps}, {"--rows", &o.rows}, {"--cols", &o.cols}},
      "troupe_layer_norm_bench [--threads T] [--reps R] [--rows N] [--cols C]");
  return o;
}

/// One candidate's three phases: the set's entry points, or the old loops.
struct candidate {
  std::string name;
  decltype(k::detail::simd_kernel_set::layer_norm_forward) forward;
  decltype(k::detail::simd_kernel_set::layer_norm_backward) backward;
  decltype(k::detail::simd_kernel_set::layer_norm_params) params;
};

/// The arrays: inputs x, dy, gamma, beta; the forward's y, mean, rstd (the backward's inputs); dx, dgamma, dbeta.
struct arrays {
  std::vector<float> x, dy, gamma, beta, y, mean, rstd, dx, dgamma, dbeta;
};

arrays make_arrays(const options& o) {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> d(-4.0f, 4.0f);
  const auto n = static_cast<std::size_t>(o.rows * o.cols), c = static_cast<std::size_t>(o.cols);
  arrays a{std::vector<float>(n), std::vector<float>(n), std::vector<float>(c), std::vector<float>(c),
           std::vector<float>(n), std::vector<float>(static_cast<std::size_t>(o.rows)),
           std::vector<float>(static_cast<std::size_t>(o.rows)), std::vector<float>(n), std::vector<float>(c),
           std::vector<float>(c)};
  for (auto* v : {&a.x, &a.dy, &a.gamma, &a.beta})
    for (float& f : *v) f = d(rng);
  return a;
}

/// The three phases of candidate c on o.threads threads, split as sequence.cpp splits them.
std::vector<std::function<void()>> phases(const candidate& c, arrays& a, const options& o) {
  const int nt = static_cast<int>(o.threads);
  const auto args = [&a, &o] {
    return layer_norm_args{a.x.data(),  o.rows,      o.cols,         a.gamma.data(), a.beta.data(),
                           1e-5f,       a.dy.data(), a.mean.data(), a.rstd.data()};
  };
  return {[&a, &o, c, nt, args] {
            const layer_norm_args l = args();
#pragma omp parallel num_threads(nt)
            c.forward(l, o.rows * omp_get_thread_num() / nt, o.rows * (omp_get_thread_num() + 1) / nt, a.y.data(),
                      a.mean.data(), a.rstd.data());
          },
          [&a, &o, c, nt, args] {
            const layer_norm_args l = args();
#pragma omp parallel num_threads(nt)
            c.backward(l, o.rows * omp_get_thread_num() / nt, o.rows * (omp_get_thread_num() + 1) / nt, a.dx.data());
          },
          [&a, &o, c, nt, args] {
            const layer_norm_args l = args();
            auto start = [&](int t) { return t == nt ? o.cols : o.cols * t / nt / 16 * 16; };
#pragma omp parallel num_threads(nt)
            c.params(l, start(omp_get_thread_num()), start(omp_get_thread_num() + 1), a.dgamma.data(), a.dbeta.data());
          }};
}

/// Every output of candidate c's three phases against the old loops' (run into `want` first), bit for bit.
bool same_bits(const candidate& old, const candidate& c, const options& o) {
  arrays want = make_arrays(o), got = make_arrays(o);
  for (auto& f : phases(old, want, o)) f();
  for (auto& f : phases(c, got, o)) f();
  auto same = [](const std::vector<float>& p, const std::vector<float>& q) {
    return std::memcmp(p.data(), q.data(), p.size() * sizeof(float)) == 0;
  };
  return same(want.y, got.y) && same(want.mean, got.mean) && same(want.rstd, got.rstd) && same(want.dx, got.dx) &&
         same(want.dgamma, got.dgamma) && same(want.dbeta, got.dbeta);
}

} // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  std::vector<candidate> cs{{"old", old_forward, old_backward, old_params}};
  for (const auto& [name, t] : k::detail::runnable_simd_kernels())
    cs.push_back({name, t->layer_norm_forward, t->layer_norm_backward, t->layer_norm_params});
  std::vector<arrays> data;
  for (std::size_t i = 0; i < cs.size(); ++i) data.push_back(make_arrays(o));
  std::vector<std::function<void()>> fs;  // phase p of candidate i at p * cs.size() + i
  for (int p = 0; p < 3; ++p)
    for (std::size_t i = 0; i < cs.size(); ++i) fs.push_back(phases(cs[i], data[i], o)[p]);
  const std::vector<double> sec = troupe::bench::median_interleaved(fs, static_cast<int>(o.reps), [&](std::size_t i) {
    for (int w = 0; w < 4; ++w) fs[i]();
  });
  const char* names[3] = {"forward", "backward_rows", "backward_params"};
  for (int p = 0; p < 3; ++p) {
    std::printf("{\"bench\":\"layer_norm\",\"phase\":\"%s\",\"rows\":%lld,\"cols\":%lld,\"threads\":%lld,\"reps\":%lld",
                names[p], static_cast<long long>(o.rows), static_cast<long long>(o.cols),
                static_cast<long long>(o.threads), static_cast<long long>(o.reps));
    double old = 0, avx2 = 0, avx512 = 0;
    for (std::size_t i = 0; i < cs.size(); ++i) {
      const double t = sec[p * cs.size() + i];
      std::printf(",\"%s_us\":%.2f", cs[i].name.c_str(), t * 1e6);
      if (cs[i].name == "old") old = t;
      if (cs[i].name == "avx2+fma") avx2 = t;
      if (cs[i].name == "avx512") avx512 = t;
    }
    if (avx2 > 0) std::printf(",\"old_over_avx2\":%.3f", old / avx2);
    if (avx512 > 0) std::printf(",\"avx2_over_avx512\":%.3f,\"old_over_avx512\":%.3f", avx2 / avx512, old / avx512);
    std::printf("}\n");
  }
  for (std::size_t i = 1; i < cs.size(); ++i)
    std::printf("{\"bench\":\"layer_norm\",\"set\":\"%s\",\"same_bits\":%s}\n", cs[i].name.c_str(),
                same_bits(cs[0], cs[i], o) ? "true" : "false");
}
