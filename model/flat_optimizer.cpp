#include "model/flat_optimizer.hpp"

#include <algorithm>

#include "kernels/kernels.hpp"
#include "kernels/sequence.hpp"
#include "tensor/error.hpp"

namespace troupe::model {

void check_segments(const std::vector<int64_t>& segments, const std::vector<bool>& decays, int64_t n,
                    const std::string& who) {
  if (decays.size() != segments.size())
    throw error(who + " with adamw: " + std::to_string(decays.size()) + " decay flags for " +
                std::to_string(segments.size()) + " segments");
  int64_t sum = 0;
  for (int64_t len : segments) sum += len;
  if (sum != n)
    throw error(who + " with adamw: segments of " + std::to_string(sum) + " values for a range of " + std::to_string(n));
}

void adamw_segments(const kernels::context& ctx, float* w, const float* g, float* m, float* v,
                    const std::vector<int64_t>& segments, const std::vector<bool>& decays, float lr,
                    float weight_decay, int64_t t) {
  // Each segment's four views, then one pass over all of them.
  std::vector<tensor> views;
  views.reserve(4 * segments.size());
  std::vector<kernels::update_slots> slots;
  slots.reserve(segments.size());
  int64_t at = 0;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const shape s{segments[i]};
    views.push_back(tensor::wrap(s, w + at));
    views.push_back(tensor::wrap_read_only(s, g + at));
    views.push_back(tensor::wrap(s, m + at));
    views.push_back(tensor::wrap(s, v + at));
    const std::size_t k = views.size() - 4;
    slots.push_back({&views[k], &views[k + 1], &views[k + 2], &views[k + 3], decays[i]});
    at += segments[i];
  }
  kernels::adamw_steps(ctx, slots, lr, 0.9f, 0.999f, 1e-8f, weight_decay, t);
}

flat_optimizer::flat_optimizer(const flat_optimizer_options& o, int64_t n)
    : o_(o), n_(n), s_(static_cast<std::size_t>(o.adamw ? 2 * n : n), 0.0f) {
  if (!o_.adamw) return;
  if (o_.segments.empty()) {
    o_.segments = {n};
    o_.segment_decays = {false};
  }
  check_segments(o_.segments, o_.segment_decays, n, "a flat optimizer");
}

void flat_optimizer::step(const kernels::context& ctx, float* w, float* g, int64_t step, int64_t before) {
  if (o_.clip_grad_norm > 0) kernels::clip_by_global_norm(ctx, {{g, n_}}, o_.clip_grad_norm);
  const float lr = scheduled_lr(o_.lr, o_.schedule, step, o_.total_steps, o_.warmup_steps);
  if (o_.adamw) {
    adamw_segments(ctx, w, g, s_.data(), s_.data() + n_, o_.segments, o_.segment_decays, lr, o_.weight_decay,
                   (before >= 0 ? before : step) + 1);
    return;
  }
  const shape s{n_};
  tensor wt = tensor::wrap(s, w), gt = tensor::wrap(s, g), vt = tensor::wrap(s, s_.data());
  if (o_.momentum == 0.0f)
    kernels::sgd_step(ctx, wt, gt, lr, o_.weight_decay);
  else
    kernels::momentum_step(ctx, wt, gt, vt, lr, o_.momentum, o_.weight_decay, false);
}

void flat_optimizer::restore(const float* s, int64_t n, const std::string& who) {
  if (n != static_cast<int64_t>(s_.size()))
    throw error(who + ": the checkpoint's " + state_name() + " has " + std::to_string(n) + " values, " +
                std::to_string(s_.size()) + " expected");
  std::copy(s, s + n, s_.begin());
}

} // namespace troupe::model
