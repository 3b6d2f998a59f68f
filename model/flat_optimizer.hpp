#pragma once

// The optimizer of parameters that live in one flat vector: an allreduce
// worker's replica, a pipeline stage's range of the layout. Momentum SGD or
// AdamW, each the sequential loop's (train/optimizers.hpp) on the same values.

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/context.hpp"
#include "model/optimizer.hpp"

namespace troupe::model {

struct flat_optimizer_options {
  bool adamw = false;                 ///< AdamW (betas 0.9 and 0.999, eps 1e-8) instead of momentum SGD
  float lr = 0.02f, momentum = 0.9f;  ///< momentum: SGD's only
  float weight_decay = 0;             ///< SGD: L2 on every value; AdamW: decoupled, on the segments that decay
  float clip_grad_norm = 0;           ///< the gradient clipped to this global L2 norm first (0: none)
  lr_schedule schedule = lr_schedule::constant;
  int64_t total_steps = 1;            ///< the schedule's length
  int64_t warmup_steps = 0;           ///< its warm-up (scheduled_lr)
  /// AdamW's groups: the sizes of the range's tensors, in order, and whether
  /// weight decay applies to each (train::decays). Empty: one segment without
  /// decay, as a shard's AdamW rule (update_config).
  std::vector<int64_t> segments;
  std::vector<bool> segment_decays;
};

/// AdamW step `t` (1-based: its bias correction) over `w`, `g` and the moments
/// `m`, `v`, cut into `segments`, decoupled decay `weight_decay` on those whose
/// `decays` flag is set. The one loop of a shard's AdamW rule and flat_optimizer's.
void adamw_segments(const kernels::context& ctx, float* w, const float* g, float* m, float* v,
                    const std::vector<int64_t>& segments, const std::vector<bool>& decays, float lr,
                    float weight_decay, int64_t t);
/// Throws troupe::error naming `who` when `segments` and `decays` differ in
/// length or `segments` do not add up to `n`.
void check_segments(const std::vector<int64_t>& segments, const std::vector<bool>& decays, int64_t n,
                    const std::string& who);

/// Momentum SGD (heavy ball; none at momentum 0) with L2 weight decay, or
/// AdamW, on the lr scheduled_lr gives each step. Its state is one flat
/// vector: SGD's velocity (n values), or AdamW's first then second moments
/// (2n); AdamW's bias correction counts the updates the caller says came
/// before (by default the step), so a resumed run's global step carries it.
class flat_optimizer {
public:
  /// Throws troupe::error when AdamW's segments do not cover `n`.
  flat_optimizer(const flat_optimizer_options& o, int64_t n);
  /// Step `step` (the schedule's, from 0) of `w` from the gradient `g`, both
  /// of n values; `g` is clipped in place when the options ask. `before`:
  /// the updates applied before this one, what AdamW's bias correction counts
  /// (-1: `step`, one update per step).
  void step(const kernels::context& ctx, float* w, float* g, int64_t step, int64_t before = -1);
  /// The state (see above): a checkpoint's, a joiner's, a rollback's.
  std::vector<float>& state() { return s_; }
  const std::vector<float>& state() const { return s_; }
  /// Its name in checkpoints and Params: "velocity" (SGD) or "adamw.moments".
  const char* state_name() const { return state_name_of(o_.adamw); }
  static const char* state_name_of(bool adamw) { return adamw ? "adamw.moments" : "velocity"; }
  /// True when state() is worth saving (AdamW, or SGD with momentum != 0).
  bool has_state() const { return o_.adamw || o_.momentum != 0.0f; }
  /// Continues from a checkpoint's state. Throws troupe::error naming `who` when its size differs.
  void restore(const float* s, int64_t n, const std::string& who);
  const flat_optimizer_options& options() const { return o_; }

private:
  flat_optimizer_options o_;
  int64_t n_;
  std::vector<float> s_;
};

} // namespace troupe::model
