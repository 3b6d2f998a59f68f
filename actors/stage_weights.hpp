#pragma once

// Where a pipeline stage's parameter updates come from: its own optimizer, the
// shard of its parameters (a hybrid on shards), or its own optimizer on the
// gradient averaged with stage k of the other pipeline replicas (a hybrid by
// allreduce). The stage's counterpart of the worker's weight_source: the
// stage (stage_core) runs the schedule and holds the weights (param_holder);
// the strategy applies each mini-batch's update to them.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/param_client.hpp"
#include "actors/param_holder.hpp"
#include "kernels/context.hpp"
#include "model/flat_optimizer.hpp"
#include "net/message.hpp"
#include "train/plan.hpp"

namespace troupe::actors {

/// The update a stage applies: its mini-batch (`step`, the lr schedule's,
/// from 0) and the updates the stage applied before it (1F1B: one per
/// micro-batch), which AdamW's bias correction counts.
struct stage_update {
  int64_t step = 0;
  int64_t before = 0;
};

class stage_weights {
public:
  /// `who`: the stage, as errors name it.
  explicit stage_weights(std::string who) : who_(std::move(who)) {}
  virtual ~stage_weights() = default;
  /// The first messages (a hybrid's pull of its shard's parameters).
  virtual std::vector<outgoing> start() { return {}; }
  /// What take() made of a message.
  enum class taken { nothing, reduced, applied };
  /// Before the norm and the update: makes the mini-batch's mean gradient `g`
  /// (w.size() values) the one the update applies. A hybrid by allreduce: the
  /// mean over the replicas' stage k. True when done now; else a take()
  /// finishes it (taken::reduced). The others: `g` as it is.
  virtual bool reduce(const kernels::context& ctx, float* g, std::vector<outgoing>& out) { return true; }
  /// Update `u`'s mean gradient `g`, of w.size() values: applied to `w` now
  /// (returns true), or sent on (`out`) and applied by the take() of its
  /// answer. `g` may be changed, and stays the caller's to keep unchanged
  /// until the update is applied.
  virtual bool update(const kernels::context& ctx, const stage_update& u, float* g, param_holder& w,
                      std::vector<outgoing>& out) = 0;
  /// A Params or Collective message for the reduction or the update under
  /// way (`out`: the messages to send in answer): whether it finished the
  /// reduction, or applied the update to `w`. Throws net::message_error for
  /// one this strategy takes none of, or that does not fit.
  virtual taken take(const net::envelope_reader& r, param_holder& w, std::vector<outgoing>& out);
  /// Forwards wait: a reduction or an update (or the first weights) has not come.
  virtual bool waiting() const { return false; }
  /// The optimizer state a checkpoint keeps of this stage (empty: none here).
  virtual std::vector<named_tensor> state() const { return {}; }
  /// Continues from a checkpoint's state (model::flat_optimizer::state_name()). Throws troupe::error when it does not fit.
  virtual void restore(const std::vector<named_tensor>& state) {}
  /// The staleness of the updates answered since the last call; starts a new tally.
  staleness_tally take_tally();

protected:
  std::string who_;
  staleness_tally tally_;
};

/// The stage's own optimizer (model::flat_optimizer: momentum SGD or AdamW) on its `n` parameters; `who` names it in errors.
std::unique_ptr<stage_weights> own_stage_weights(const model::flat_optimizer_options& o, int64_t n, std::string who);
/// A hybrid on shards: each update's gradient is pushed to `shard`, which
/// holds the stage's range `range` of `layout`; its Params answer are the new
/// weights. The forwards wait for the first pull's answer, then for each push's.
std::unique_ptr<stage_weights> shard_stage_weights(const net::address& self, const net::address& shard,
                                                   const model::shard_range& range, int stage,
                                                   const model::param_layout& layout);
/// A hybrid by allreduce: stage k of every pipeline replica (`peers`, by
/// replica; this stage is `member`) averages each update's gradient (reduce),
/// then steps by its own optimizer, the same on every replica.
std::unique_ptr<stage_weights> allreduce_stage_weights(const model::flat_optimizer_options& o, int64_t n,
                                                       const std::vector<net::address>& peers, int32_t member);

} // namespace troupe::actors
