#include "model/scaling.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "tensor/error.hpp"

namespace troupe::model {

namespace {

/// Messages of at most `piece` bytes that `bytes` takes (one for an empty one).
double messages(double bytes, int64_t piece) {
  return std::max(1.0, std::ceil(bytes / static_cast<double>(std::max<int64_t>(1, piece))));
}

void check(const scaling_inputs& in, int n, const char* what) {
  if (n < 1) throw error(std::string(what) + ": " + std::to_string(n) + " workers (at least 1)");
  if (!(in.compute_s >= 0) || !(in.update_s >= 0) || in.param_bytes < 0 || !(in.link.a >= 0) || !(in.link.b >= 0))
    throw error(std::string(what) + ": negative or NaN costs");
}

scaling_estimate finish(const scaling_inputs& in, double comm_s, double step_s) {
  scaling_estimate e;
  e.comm_s = comm_s;
  e.step_s = step_s;
  e.efficiency = step_s > 0 ? in.compute_s / step_s : 1.0;
  return e;
}

} // namespace

double ring_allreduce_s(int64_t bytes, int n, const link_cost& l, int64_t piece_bytes) {
  if (n <= 1) return 0;
  const double chunk = static_cast<double>(bytes) / n;
  return 2.0 * (n - 1) * (l.a * chunk + l.b * messages(chunk, piece_bytes));
}

double doubling_allreduce_s(int64_t bytes, int n, const link_cost& l, int64_t piece_bytes) {
  if (n <= 1) return 0;
  int p = 1, rounds = 0;
  while (p * 2 <= n) {
    p *= 2;
    ++rounds;
  }
  if (p != n) rounds += 2;
  const double b = static_cast<double>(bytes);
  return rounds * (l.a * b + l.b * messages(b, piece_bytes));
}

scaling_estimate allreduce_estimate(const scaling_inputs& in, int n) {
  check(in, n, "allreduce_estimate");
  auto reduce = [&](double bytes) {
    const auto b = static_cast<int64_t>(bytes);
    return b < in.small_bytes ? doubling_allreduce_s(b, n, in.link, in.piece_bytes)
                              : ring_allreduce_s(b, n, in.link, in.piece_bytes);
  };
  const double bytes = static_cast<double>(in.param_bytes);
  const double buckets =
      in.bucket_bytes > 0 ? std::max(1.0, std::ceil(bytes / static_cast<double>(in.bucket_bytes))) : 1.0;
  const double last = bytes - (buckets - 1) * static_cast<double>(in.bucket_bytes);  // after backward
  const double early = (buckets - 1) * reduce(static_cast<double>(in.bucket_bytes));   // during backward
  const double backward = std::min(in.backward_s, in.compute_s);
  const double step = (in.compute_s - backward) + std::max(backward, early) + reduce(last) + in.update_s;
  return finish(in, step - in.compute_s - in.update_s, step);
}

scaling_estimate ssgd_estimate(const scaling_inputs& in, int n, int shards) {
  check(in, n, "ssgd_estimate");
  if (shards < 1) throw error("ssgd_estimate: " + std::to_string(shards) + " shards (at least 1)");
  const double share = static_cast<double>(in.param_bytes) / shards;
  // A worker sends its whole gradient but the share of a shard on its own node; a shard's node takes in
  // the other n - 1 workers' shares of it. Both ways at once: the busier one bounds the phase.
  const double out = n > shards ? static_cast<double>(in.param_bytes) : share * (shards - 1);
  const double push = in.link.a * std::max(out, share * (n - 1)) + in.link.b;
  const double reply = in.link.a * share * (n - 1) + in.link.b;  // n - 1 replies of its share from each shard
  const double comm = n > 1 || shards > 1 ? push + reply : 0;
  return finish(in, comm, in.compute_s + comm + in.update_s / shards);
}

scaling_estimate asgd_estimate(const scaling_inputs& in, int n, int shards) {
  check(in, n, "asgd_estimate");
  if (shards < 1) throw error("asgd_estimate: " + std::to_string(shards) + " shards (at least 1)");
  const double share = static_cast<double>(in.param_bytes) / shards;
  // One worker: its push out and the reply in, a message per shard, and its shards' work on it; with
  // the shards on the workers' nodes, the share of its own node's shard stays off the link.
  const double remote = n >= shards ? share * (shards - 1) : static_cast<double>(in.param_bytes);
  const double trip = 2 * (in.link.a * remote + in.link.b * shards);
  const double cycle = in.compute_s + trip + in.update_s;
  // A shard's link: every worker's push in and reply out, each way n shares per round of updates.
  const double link_bound = in.link.a * share * n + in.link.b * n;
  const double step = std::max(cycle, link_bound);
  return finish(in, step - in.compute_s, step);
}

int shards_to_keep_up(const scaling_inputs& in, int n, int max_shards) {
  const double best = asgd_estimate(in, n, max_shards).step_s;
  for (int s = 1; s < max_shards; ++s)
    if (asgd_estimate(in, n, s).step_s <= 1.05 * best) return s;
  return max_shards;
}

} // namespace troupe::model
