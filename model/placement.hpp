#pragma once

// Placement of a chain of layers on heterogeneous devices as pipeline stages
// (docs/algorithms.md, "Placement"): a cost model and four placers (random,
// greedy, optimal, manual), all pure. A placement cuts the chain into K
// contiguous, non-empty stages and gives each stage its own device.
//
// The cost model, per mini-batch:
//  * stage k holds layers [first, last) on device d:
//      compute_s  = sum over its layers of (fwd_s + bwd_s) / speed(d)
//      transfer_s = 2 * link.time(act_bytes[last - 1]) for every stage but the
//                   last: the activation it sends over its outgoing cut and the
//                   gradient of the same size it receives back over that cut
//      time_s     = compute_s + transfer_s (a stage's sends and receives on
//                   its outgoing cut are counted as not overlapping its compute)
//      memory     = ceil(memory_factor * sum param_bytes) + sum act_bytes
//    (parameters with their gradients and optimizer state, memory_factor 3 for
//    momentum SGD, 4 for Adam; plus every layer's output activation, kept for
//    backward);
//  * a pipeline's steady state runs at the pace of its slowest stage, so the
//    predicted step time is the bottleneck max_k time_s (the pipeline's fill
//    and drain are not counted); every placer minimizes it.
//
// Memory limits are never violated: a placer that cannot fit the model throws
// troupe::error naming the device and the bytes it is short of.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace troupe::model {

/// The costs of one layer of the chain, on a device of speed 1, per mini-batch.
struct layer_cost {
  double fwd_s = 0;
  double bwd_s = 0;
  int64_t param_bytes = 0;
  int64_t act_bytes = 0;  ///< its output activation; crosses a cut after this layer (its gradient comes back)
};

/// A device a stage may run on. (Not `device`: that is the tensor's device tag.)
struct device_cost {
  std::string name;
  double speed = 1;          ///< relative, > 0: time on it = time at speed 1 / speed
  int64_t memory_bytes = 0;  ///< 0: unlimited
};

/// The cost of one message between stages: time(bytes) = a * bytes + b.
struct link_cost {
  double a = 0;  ///< seconds per byte
  double b = 0;  ///< seconds per message
  double time(int64_t bytes) const { return a * static_cast<double>(bytes) + b; }
};

/// The least-squares line through (bytes, seconds) points, as Baechi fits its
/// communication cost. A negative intercept (noise) is clamped to 0 and the
/// slope refitted through the origin; a negative slope is clamped to 0. Throws
/// troupe::error for fewer than two distinct sizes.
link_cost fit_link(const std::vector<std::pair<int64_t, double>>& bytes_seconds);

/// K stages: stage k holds layers [cuts[k-1], cuts[k]) (cuts[-1] = 0, cuts[K-1] = N)
/// and runs on devices[k].
struct placement {
  std::vector<int> cuts;     ///< the first layer of stages 1..K-1: K-1 values, increasing, in [1, N-1]
  std::vector<int> devices;  ///< the device index of each stage: K distinct values
};
/// "cuts [3 5] devices [1 0 2]".
std::string to_string(const placement& p);

/// The placers; "random", "greedy", "optimal", "manual".
enum class placer_kind { random, greedy, optimal, manual };
const char* to_string(placer_kind k);
/// Throws troupe::error for an unknown name, listing the known ones.
placer_kind parse_placer(const std::string& name);

struct placement_options {
  int stages = 0;              ///< K; 0: one per device (one per layer where there are fewer layers)
  double memory_factor = 3;    ///< see the memory formula above
  uint64_t seed = 1;           ///< random: the draw
  int random_tries = 1000;     ///< random: draws until one fits the memory limits
  bool refine = true;          ///< greedy: bisect the shares and move cuts (see place_greedy)
  bool reorder = true;         ///< greedy: search the device order (see place_greedy)
};

/// One stage of an evaluated placement.
struct stage_estimate {
  int first = 0, last = 0;  ///< layers [first, last)
  int device = 0;
  double fwd_s = 0, bwd_s = 0;  ///< on its device
  double transfer_s = 0;        ///< activation out + gradient in over its outgoing cut; 0 for the last stage
  double time_s = 0;            ///< fwd_s + bwd_s + transfer_s
  int64_t send_bytes = 0;       ///< the activation it sends (0 for the last stage)
  int64_t memory_bytes = 0;
  bool fits = true;             ///< memory_bytes within its device's limit
};

struct placement_estimate {
  std::vector<stage_estimate> stages;
  int bottleneck = 0;   ///< the slowest stage (the first of equals)
  double step_s = 0;    ///< predicted step time: stages[bottleneck].time_s
  bool fits = true;     ///< every stage fits its device
};

/// The memory a stage holding layers [first, last) needs (the formula above).
int64_t stage_memory(const std::vector<layer_cost>& costs, int first, int last, double memory_factor = 3);

/// The cost model applied to `p`. Throws troupe::error for invalid costs,
/// devices or link, or a malformed placement (cut count, order, range,
/// device indices, a device used twice); reports memory overruns in `fits`.
placement_estimate evaluate(const std::vector<layer_cost>& costs, const std::vector<device_cost>& devices,
                            const link_cost& link, const placement& p, const placement_options& o = {});

/// Random placement (the baseline): K-1 distinct cut points drawn uniformly,
/// K distinct devices in a random order, from `o.seed`; draws again while the
/// memory limits are violated, up to `o.random_tries` times, then throws.
placement place_random(const std::vector<layer_cost>& costs, const std::vector<device_cost>& devices,
                       const link_cost& link, const placement_options& o = {});

/// Greedy placement.
///  * Devices: the K fastest, in three orders (speed descending, ascending,
///    as given): on a chain the order decides which device gets the uneven
///    layers, and an O(N) walk per order is cheap.
///  * The walk (issue 12's greedy): stage k's share of the remaining cost is
///    proportional to its device's speed among the remaining devices; the
///    layer where the share ends goes to this stage or the next, whichever
///    leaves the smaller max(this stage's time with its cut's transfer, the
///    remaining cost spread evenly over the remaining devices). A cut that
///    would leave the rest unable to fit the memory of the remaining devices
///    is never chosen. With refine and reorder off, this is all.
///  * o.refine: the walk again with every share scaled to tau * speed
///    (time and transfer within tau), each device filled as far as its share
///    goes, tau bisected down to the least that still covers the chain; then
///    a cut of the bottleneck stage moved by one layer while that lowers it.
///  * o.reorder (a local search over device orders, beyond issue 12's walk,
///    which alone is not close enough to the optimum: bench/placement_study):
///    from each of the three orders, repeatedly re-match devices to the
///    stages (the bottleneck matching over any K of the devices: exact for
///    fixed cuts) and cut anew for that order, else swap two stages' devices
///    (or a stage's for an unused one) or move one device elsewhere in the
///    order, cutting anew, keeping the first change that lowers the
///    bottleneck; the best end point wins.
/// Never better than place_optimal; deterministic. Where none of the three
/// orders fits the memory, one that does is found by dynamic programming
/// over device subsets (up to 16 devices), so greedy fails only where no
/// placement fits.
placement place_greedy(const std::vector<layer_cost>& costs, const std::vector<device_cost>& devices,
                       const link_cost& link, const placement_options& o = {});

/// The placement of minimum predicted step time over every partition into K
/// contiguous stages and every assignment of K distinct devices: dynamic
/// programming over (layers placed, set of devices used) -> least bottleneck,
/// exact because a stage's time depends only on its layers and its device.
/// O(2^D N^2 D) time, O(2^D N) memory; throws troupe::error for more than 16 devices.
placement place_optimal(const std::vector<layer_cost>& costs, const std::vector<device_cost>& devices,
                        const link_cost& link, const placement_options& o = {});

/// A placement the user gives: validated (as evaluate) and checked against
/// the memory limits (troupe::error naming the stage, device and shortfall).
placement place_manual(const std::vector<layer_cost>& costs, const std::vector<device_cost>& devices,
                       const placement& p, const placement_options& o = {});

} // namespace troupe::model
