#pragma once

// The optimizer of parameters that live in one flat vector: an allreduce
// worker's replica, a pipeline stage's range of the layout.

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/context.hpp"
#include "model/optimizer.hpp"

namespace troupe::model {

struct flat_sgd_options {
  float lr = 0.02f, momentum = 0.9f, weight_decay = 0;
  float clip_grad_norm = 0;           ///< the gradient clipped to this global L2 norm first (0: none)
  lr_schedule schedule = lr_schedule::constant;
  int64_t total_steps = 1;            ///< the schedule's length
  int64_t warmup_steps = 0;           ///< its warm-up (scheduled_lr)
};

/// SGD with momentum (heavy ball; none at momentum 0) and weight decay, on
/// the lr scheduled_lr gives each step; its state is the momentum ("velocity").
class flat_sgd {
public:
  flat_sgd(const flat_sgd_options& o, int64_t n) : o_(o), v_(static_cast<std::size_t>(n), 0.0f) {}
  /// Step `step` (the schedule's, from 0) of `w` from the gradient `g`, both
  /// of n values; `g` is clipped in place when the options ask.
  void step(const kernels::context& ctx, float* w, float* g, int64_t step);
  /// The momentum: a checkpoint's state (empty meaning: none, at momentum 0).
  std::vector<float>& velocity() { return v_; }
  const std::vector<float>& velocity() const { return v_; }
  /// True when velocity() is state worth saving (momentum != 0).
  bool has_state() const { return o_.momentum != 0.0f; }
  /// Continues from a checkpoint's velocity. Throws troupe::error naming `who` when its size differs.
  void restore(const float* v, int64_t n, const std::string& who);
  const flat_sgd_options& options() const { return o_; }

private:
  flat_sgd_options o_;
  std::vector<float> v_;
};

} // namespace troupe::model
