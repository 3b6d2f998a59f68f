#pragma once

// The step time of a data-parallel job for any number of workers, from one
// worker's compute time and the links' cost (a seconds per byte, b per
// message): synchronous allreduce (a ring, or recursive doubling for small
// buffers), and parameter shards, synchronous (SSGD) and asynchronous (ASGD).
// One worker per node, each node's link full duplex; docs/experiments.md says
// what it leaves out and how it compares with measured runs.

#include <cstdint>
#include <utility>
#include <vector>

#include "model/placement.hpp"

namespace troupe::model {

struct scaling_inputs {
  double compute_s = 0;            ///< one worker's forward and backward of its batch
  double backward_s = 0;           ///< of which backward: an allreduce's buckets overlap it
  int64_t bucket_bytes = 0;        ///< an allreduce's buckets (0: one, after backward)
  double update_s = 0;             ///< one optimizer step over all the parameters (elementwise)
  int64_t param_bytes = 0;         ///< the gradient on the wire (and the parameters a shard sends back)
  link_cost link;                  ///< each node's link: a * bytes + b per message, both ways at once
  int64_t piece_bytes = 262144;    ///< an allreduce sends a chunk in messages of at most this
  int64_t small_bytes = 8192;      ///< an allreduce of fewer bytes runs by recursive doubling
  /// Whether communication overlaps backward (an allreduce's buckets; a shard's pushes once its
  /// gradients are complete, as pipelined execution sends them): true with one worker per node (a core
  /// of its own); false where more node processes than cores share a host (each ring round passes
  /// through every process, and those waiting for a core hold it up until backward is over), or for
  /// linear execution.
  bool overlap_backward = true;
  /// When backward has finished each part of the gradient, in layout order: (the part's bytes, seconds
  /// into backward). Shards push a part once it is finished (set_compute fills it from the layers'
  /// costs); empty: everything at backward's end.
  std::vector<std::pair<double, double>> gradient_ready;
  /// The gradient's tensors in layout order (bytes each): shards hold whole
  /// tensors, cut as troupe's plan cuts them (model::plan_shards: the largest
  /// as small as it can be; no more shards than tensors). Empty: param_bytes
  /// in even shares, as many as asked (model::shard_cut::even).
  std::vector<int64_t> tensor_bytes;
};

/// One worker's compute from its layers' measured costs (model::measure_costs): compute_s, backward_s
/// (with the update) and gradient_ready (backward runs the layers from the last one).
void set_compute(scaling_inputs& in, const std::vector<layer_cost>& costs);
/// The same compute `factor` times as long (compute_s, backward_s and gradient_ready's times).
void scale_compute(scaling_inputs& in, double factor);

struct scaling_estimate {
  double step_s = 0;      ///< until every worker has made one update
  double comm_s = 0;      ///< of which waiting for the network
  double efficiency = 0;  ///< compute_s / step_s
};

/// A link of `bits_per_s` as TCP over Ethernet uses it for payload: a segment of `mtu` bytes carries
/// mtu - 52 (IP and TCP headers with timestamps) in mtu + `frame_bytes` on the link (14 where only
/// the Ethernet header is counted, as tbf counts on a veth; 38 on a wire, with preamble, FCS and gap).
/// No frames for acknowledgements: every scheme here sends both ways at once, and they ride on the
/// reverse direction's data. `per_message_s` is b.
link_cost tcp_link(double bits_per_s, double per_message_s, int mtu, int frame_bytes);

/// A ring allreduce of `bytes` among `n`: 2 (n - 1) rounds of a chunk of bytes / n.
double ring_allreduce_s(int64_t bytes, int n, const link_cost& l, int64_t piece_bytes);
/// Recursive doubling: log2 p rounds of the whole buffer (p the largest power
/// of two <= n), two more when n is not one (the extra members folded in and out).
double doubling_allreduce_s(int64_t bytes, int n, const link_cost& l, int64_t piece_bytes);

/// Compute, then the allreduce (the cheaper algorithm for the size), then the
/// update; with buckets, all but the last bucket's reduction overlap backward
/// (buckets of equal size: the cut by tensors is not modelled) unless
/// `in.overlap_backward` is false.
scaling_estimate allreduce_estimate(const scaling_inputs& in, int n);
/// The bytes of each shard when `in`'s gradient is cut into `shards` (fewer
/// when it has fewer tensors; see scaling_inputs::tensor_bytes).
std::vector<double> shard_bytes(const scaling_inputs& in, int shards);
/// SSGD through `shards` shards (shard_bytes) on as many of the n nodes (on
/// nodes of their own when there are more shards than workers): every
/// worker's pushes reach the shards, the shards apply the round, then send it
/// back. Each phase lasts as long as the busiest direction of any node's link
/// (a shard's node takes in n - 1 pushes of its shard, then sends n - 1
/// replies; the largest shard bounds both); a push leaves once backward has
/// finished its shard's part (gradient_ready), during backward if it can.
scaling_estimate ssgd_estimate(const scaling_inputs& in, int n, int shards);
/// ASGD on `shards` shards (as for SSGD): a worker's cycle is its compute, its
/// push (each shard's part once backward has finished it) and the replies
/// (less its own node's shard's share); a round of n
/// updates puts on each shard node's link, each way, its own worker's pushes
/// to the other shards and its shard's n - 1 replies, so the step is at least
/// the busiest node's round. It leaves out that workers go at unequal paces
/// (docs/experiments.md: it is not within 15 % of measured runs).
scaling_estimate asgd_estimate(const scaling_inputs& in, int n, int shards);
/// The fewest shards (up to `max_shards`) with which ASGD's step is within 5 %
/// of its step with `max_shards`: how many a PS job needs to keep up.
int shards_to_keep_up(const scaling_inputs& in, int n, int max_shards);

} // namespace troupe::model
