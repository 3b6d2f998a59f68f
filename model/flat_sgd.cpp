#include "model/flat_sgd.hpp"

#include <algorithm>

#include "kernels/kernels.hpp"
#include "tensor/error.hpp"

namespace troupe::model {

void flat_sgd::step(const kernels::context& ctx, float* w, float* g, int64_t step) {
  const auto n = static_cast<int64_t>(v_.size());
  if (o_.clip_grad_norm > 0) kernels::clip_by_global_norm(ctx, {{g, n}}, o_.clip_grad_norm);
  const float lr = scheduled_lr(o_.lr, o_.schedule, step, o_.total_steps, o_.warmup_steps);
  const shape s{n};
  tensor wt = tensor::wrap(s, w), gt = tensor::wrap(s, g), vt = tensor::wrap(s, v_.data());
  if (o_.momentum == 0.0f)
    kernels::sgd_step(ctx, wt, gt, lr, o_.weight_decay);
  else
    kernels::momentum_step(ctx, wt, gt, vt, lr, o_.momentum, o_.weight_decay, false);
}

void flat_sgd::restore(const float* v, int64_t n, const std::string& who) {
  if (n != static_cast<int64_t>(v_.size()))
    throw error(who + ": the checkpoint's velocity has " + std::to_string(n) + " values, " + std::to_string(v_.size()) +
                " expected");
  std::copy(v, v + n, v_.begin());
}

} // namespace troupe::model
