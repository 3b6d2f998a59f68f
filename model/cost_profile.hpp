#pragma once

// The cost model's inputs for a chain (model/placement.hpp): per layer, the
// time of its forward and backward passes, its parameter bytes and the bytes
// of its output activation, per mini-batch of a pipeline.

#include <cstdint>
#include <vector>

#include "kernels/context.hpp"
#include "model/model.hpp"
#include "model/placement.hpp"

namespace troupe::model {

/// Times every layer of the built model `m` on `ctx`: the forward and backward
/// passes of a micro-batch of `micro_batch` random samples, layer by layer,
/// one warm-up and then the median of `reps` runs; times and activation bytes
/// are per mini-batch (x `micro_batches`, the messages a cut sends). A layer
/// before the first one that learns computes no input gradient (as in
/// training), so its backward time is 0. The backward time includes
/// `updates` parameter updates as a stage makes them (average the summed
/// gradients, copy the weights a micro-batch in flight still holds, a momentum
/// step, clear the gradients): 1 per mini-batch for GPipe, one per
/// micro-batch for 1F1B. Throws troupe::error for micro_batch, micro_batches
/// or reps < 1, or updates < 0.
std::vector<layer_cost> measure_costs(model& m, int64_t micro_batch, int micro_batches, const kernels::context& ctx,
                                      int reps = 5, int updates = 1);

/// The same without running anything: the layers' multiply-adds
/// (model::profile) at `macs_per_s`, backward twice the forward. The same on
/// every node of a cluster, where measured times would differ from node to
/// node and so would the placements computed from them.
std::vector<layer_cost> estimate_costs(const model::layer_profile& p, int64_t micro_batch, int micro_batches,
                                       double macs_per_s = 10e9);

/// Stages of one process exchange activations as in-memory messages: a copy
/// into the message and one out, and an actor's dispatch (not fitted; a
/// default of the right order on this project's machines).
inline link_cost same_process_link() { return {1.0 / 4e9, 20e-6}; }

} // namespace troupe::model
