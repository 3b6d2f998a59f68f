#include "model/cost_profile.hpp"

#include <algorithm>
#include <chrono>
#include <random>

#include "kernels/kernels.hpp"
#include "tensor/error.hpp"

namespace troupe::model {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

tensor random_tensor(const shape& s, std::mt19937& rng) {
  tensor t = tensor::empty(s);
  std::normal_distribution<float> d(0.0f, 1.0f);
  float* p = static_cast<float*>(t.data());
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = d(rng);
  return t;
}

shape with_batch(int64_t n, const shape& s) {
  std::vector<int64_t> dims{n};
  for (int64_t d : s.dims()) dims.push_back(d);
  return shape(dims);
}

} // namespace

namespace {

/// Seconds of one parameter update of `n` floats as a pipeline stage makes it (median of `reps`).
double update_seconds(int64_t n, const kernels::context& ctx, int reps) {
  if (n == 0) return 0;
  const shape s{n};
  std::vector<float> w(static_cast<std::size_t>(n), 0.5f), g(w.size(), 0.25f), v(w.size(), 0.0f);
  std::vector<double> t;
  using clock = std::chrono::steady_clock;
  for (int r = 0; r <= reps; ++r) {
    const auto t0 = clock::now();
    for (float& x : g) x *= 0.5f;
    std::vector<float> fresh(w);  // the version a micro-batch in flight holds stays as it is
    tensor wt = tensor::wrap(s, fresh.data()), gt = tensor::wrap(s, g.data()), vt = tensor::wrap(s, v.data());
    kernels::momentum_step(ctx, wt, gt, vt, 1e-6f, 0.9f, 0.0f, false);
    std::fill(g.begin(), g.end(), 0.25f);
    w.swap(fresh);
    if (r > 0) t.push_back(std::chrono::duration<double>(clock::now() - t0).count());
  }
  return median(t);
}

} // namespace

std::vector<layer_cost> measure_costs(model& m, int64_t micro_batch, int micro_batches, const kernels::context& ctx,
                                      int reps, int updates) {
  if (micro_batch < 1 || micro_batches < 1 || reps < 1 || updates < 0)
    throw error("measure_costs: micro-batch size, micro-batches and repetitions must be at least 1, updates >= 0");
  const model::layer_profile prof = m.profile();
  const std::size_t n = m.size();
  std::mt19937 rng(1);
  tensor x = random_tensor(with_batch(micro_batch, m.input_shape()), rng);
  if (const int64_t ids = n ? m.at(0).input_ids() : 0; ids > 0) {  // token ids, not real values
    std::uniform_int_distribution<int64_t> id(0, ids - 1);
    for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = static_cast<float>(id(rng));
  }
  const tensor dy = random_tensor(with_batch(micro_batch, m.output_shape()), rng);
  std::vector<std::vector<double>> fwd(n), bwd(n);
  using clock = std::chrono::steady_clock;
  for (int r = 0; r <= reps; ++r) {  // run 0 warms up
    const tensor* cur = &x;
    for (std::size_t i = 0; i < n; ++i) {
      const auto t0 = clock::now();
      cur = &m.at(i).forward(ctx, *cur, true);
      if (r > 0) fwd[i].push_back(std::chrono::duration<double>(clock::now() - t0).count());
    }
    const tensor* g = &dy;
    for (std::size_t i = n; i-- > 0;) {
      double s = 0;
      if (g->defined()) {
        const auto t0 = clock::now();
        g = &m.at(i).backward(ctx, *g);
        s = std::chrono::duration<double>(clock::now() - t0).count();
      }
      if (r > 0) bwd[i].push_back(s);
    }
  }
  std::vector<layer_cost> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    out[i].fwd_s = median(fwd[i]) * micro_batches;
    out[i].bwd_s = median(bwd[i]) * micro_batches +
                   updates * update_seconds(prof.param_bytes[i] / static_cast<int64_t>(sizeof(float)), ctx, reps);
    out[i].param_bytes = prof.param_bytes[i];
    out[i].act_bytes = prof.output_elems[i] * micro_batch * micro_batches * static_cast<int64_t>(sizeof(float));
  }
  return out;
}

std::vector<layer_cost> estimate_costs(const model::layer_profile& p, int64_t micro_batch, int micro_batches,
                                       double macs_per_s) {
  if (micro_batch < 1 || micro_batches < 1 || !(macs_per_s > 0))
    throw error("estimate_costs: micro-batch size, micro-batches and the rate must be positive");
  std::vector<layer_cost> out(p.costs.size());
  const double samples = static_cast<double>(micro_batch) * micro_batches;
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i].fwd_s = static_cast<double>(p.costs[i]) * samples / macs_per_s;
    out[i].bwd_s = 2 * out[i].fwd_s;
    out[i].param_bytes = p.param_bytes[i];
    out[i].act_bytes = p.output_elems[i] * micro_batch * micro_batches * static_cast<int64_t>(sizeof(float));
  }
  return out;
}

} // namespace troupe::model
