#include "model/scaling.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "model/layout.hpp"
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

/// The update of the largest shard (of `largest` bytes): the shards apply theirs in parallel.
double largest_update_s(const scaling_inputs& in, double largest) {
  return in.param_bytes > 0 ? in.update_s * largest / static_cast<double>(in.param_bytes) : 0;
}

/// The backward time that communication may overlap.
double overlappable_s(const scaling_inputs& in) {
  return in.overlap_backward ? std::min(in.backward_s, in.compute_s) : 0.0;
}

scaling_estimate finish(const scaling_inputs& in, double comm_s, double step_s) {
  scaling_estimate e;
  e.comm_s = comm_s;
  e.step_s = step_s;
  e.efficiency = step_s > 0 ? in.compute_s / step_s : 1.0;
  return e;
}

} // namespace

link_cost tcp_link(double bits_per_s, double per_message_s, int mtu, int frame_bytes) {
  constexpr int headers = 52;  // IPv4 20, TCP 20, timestamps 12
  if (!(bits_per_s > 0) || mtu <= headers || frame_bytes < 0 || !(per_message_s >= 0))
    throw error("tcp_link: a rate above 0, an MTU above " + std::to_string(headers) +
                " bytes and no negative overheads");
  const double on_link = mtu + frame_bytes;
  return {8.0 / bits_per_s * on_link / (mtu - headers), per_message_s};
}

void set_compute(scaling_inputs& in, const std::vector<layer_cost>& costs) {
  in.compute_s = in.backward_s = 0;
  in.gradient_ready.assign(costs.size(), {0.0, 0.0});
  for (std::size_t i = costs.size(); i-- > 0;) {  // backward runs from the last layer
    in.compute_s += costs[i].fwd_s + costs[i].bwd_s;
    in.backward_s += costs[i].bwd_s;
    in.gradient_ready[i] = {static_cast<double>(costs[i].param_bytes), in.backward_s};  // finished with its layer
  }
}

void scale_compute(scaling_inputs& in, double factor) {
  in.compute_s *= factor;
  in.backward_s *= factor;
  for (auto& part : in.gradient_ready) part.second *= factor;
}

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
  const double backward = overlappable_s(in);
  const double step = (in.compute_s - backward) + std::max(backward, early) + reduce(last) + in.update_s;
  return finish(in, step - in.compute_s - in.update_s, step);
}

std::vector<double> shard_bytes(const scaling_inputs& in, int shards) {
  if (shards < 1) throw error("shard_bytes: " + std::to_string(shards) + " shards (at least 1)");
  if (in.tensor_bytes.empty())
    return std::vector<double>(static_cast<std::size_t>(shards), static_cast<double>(in.param_bytes) / shards);
  const int parts = std::min<int>(shards, static_cast<int>(in.tensor_bytes.size()));
  const std::vector<std::size_t> bounds = contiguous_partition(in.tensor_bytes, parts, "shards");
  std::vector<double> out;
  for (int i = 0; i < parts; ++i) {
    double sum = 0;
    for (std::size_t t = bounds[i]; t < bounds[i + 1]; ++t) sum += static_cast<double>(in.tensor_bytes[t]);
    out.push_back(sum);
  }
  return out;
}

namespace {

/// When backward has finished each shard's part of the gradient (`bytes` of each, in layout order): the
/// latest of the parts of gradient_ready it covers, at most the end of backward.
std::vector<double> shards_ready_s(const scaling_inputs& in, const std::vector<double>& bytes) {
  const double backward = overlappable_s(in);
  std::vector<double> out(bytes.size(), backward);
  double total = 0;
  for (const auto& part : in.gradient_ready) total += part.first;
  if (backward <= 0 || total <= 0 || in.param_bytes <= 0) return out;
  const double scale = total / static_cast<double>(in.param_bytes);  // gradient_ready's bytes per byte here
  double lo = 0;
  for (std::size_t k = 0; k < bytes.size(); ++k) {
    const double hi = lo + bytes[k] * scale;
    double ready = 0, at = 0;
    for (const auto& [part, when] : in.gradient_ready) {
      if (part > 0 && at < hi && at + part > lo) ready = std::max(ready, when);
      at += part;
    }
    out[k] = std::min(ready, backward);
    lo = hi;
  }
  return out;
}

/// Parts one direction of a link sends: bytes, messages, and when into backward they are ready.
struct part {
  double bytes = 0, messages = 0, ready = 0;
};

/// When a direction sending `parts` in the order they are ready is done, from backward's start.
double sent_by_s(const link_cost& l, std::vector<part> parts) {
  std::stable_sort(parts.begin(), parts.end(), [](const part& x, const part& y) { return x.ready < y.ready; });
  double t = 0;
  for (const part& p : parts) t = std::max(t, p.ready) + l.a * p.bytes + l.b * p.messages;
  return t;
}

/// What one direction of a node's link carries in SSGD's push phase and in its reply phase.
struct direction {
  std::vector<part> push;
  double reply = 0, reply_messages = 0;
};

/// The push phase (each direction's parts once ready, during backward where they can be), then the
/// reply phase, each as long as its busiest direction: the step's time after forward, less the update.
double two_phases_s(const scaling_inputs& in, const std::vector<direction>& dirs) {
  double push = overlappable_s(in), reply = 0;
  for (const direction& d : dirs) {
    push = std::max(push, sent_by_s(in.link, d.push));
    reply = std::max(reply, in.link.a * d.reply + in.link.b * d.reply_messages);
  }
  return push + reply;
}

} // namespace

scaling_estimate ssgd_estimate(const scaling_inputs& in, int n, int shards) {
  check(in, n, "ssgd_estimate");
  const std::vector<double> s = shard_bytes(in, shards);
  const auto S = static_cast<int>(s.size());
  const double all = static_cast<double>(in.param_bytes), largest = *std::max_element(s.begin(), s.end());
  if (n == 1 && S == 1) return finish(in, 0, in.compute_s + largest_update_s(in, largest));
  // Each direction of each node's link: with the shards on the workers' nodes, node j pushes all but its
  // own shard's share and takes in n - 1 pushes of it; the replies are the same bytes the other way.
  // A message per shard from each worker, a reply per worker from each shard; a push leaves when
  // backward has finished its shard's part.
  const std::vector<double> ready = shards_ready_s(in, s);
  auto pushes_but = [&](int own) {
    std::vector<part> out;
    for (int k = 0; k < S; ++k)
      if (k != own) out.push_back({s[static_cast<std::size_t>(k)], 1, ready[static_cast<std::size_t>(k)]});
    return out;
  };
  std::vector<direction> dirs;
  if (n >= S) {
    for (int j = 0; j < n; ++j) {
      const bool has = j < S;
      const double own = has ? s[static_cast<std::size_t>(j)] : 0.0, others = has ? S - 1 : S, peers = has ? n - 1 : 0;
      dirs.push_back({pushes_but(has ? j : -1), (n - 1) * own, peers});  // out
      std::vector<part> in_push;
      if (has) in_push.push_back({(n - 1) * own, peers, ready[static_cast<std::size_t>(j)]});
      dirs.push_back({in_push, all - own, others});  // in
    }
  } else {  // a worker's node sends and takes in everything; a shard's node takes n pushes, sends n replies
    dirs.push_back({pushes_but(-1), 0, 0});
    dirs.push_back({{}, all, double(S)});
    for (int k = 0; k < S; ++k) {
      const double mine = s[static_cast<std::size_t>(k)];
      dirs.push_back({{{n * mine, double(n), ready[static_cast<std::size_t>(k)]}}, 0, 0});
      dirs.push_back({{}, n * mine, double(n)});
    }
  }
  const double backward = overlappable_s(in), update = largest_update_s(in, largest);
  const double step = (in.compute_s - backward) + two_phases_s(in, dirs) + update;
  return finish(in, step - in.compute_s - update, step);
}

scaling_estimate asgd_estimate(const scaling_inputs& in, int n, int shards) {
  check(in, n, "asgd_estimate");
  const std::vector<double> s = shard_bytes(in, shards);
  const auto S = static_cast<int>(s.size());
  const double all = static_cast<double>(in.param_bytes);
  const auto [smallest, largest] = std::minmax_element(s.begin(), s.end());
  // A worker's cycle: its push out and the replies in, a message per shard, and the largest shard's work;
  // with the shards on the workers' nodes, its own node's share stays off the link (the least for the
  // worker whose node's shard is the smallest; none for one whose node has no shard).
  // Its pushes leave as backward finishes their parts (the own node's one a message without bytes).
  const double remote = n > S ? all : all - *smallest;
  const std::vector<double> ready = shards_ready_s(in, s);
  const auto own = n > S ? -1 : static_cast<int>(smallest - s.begin());
  std::vector<part> pushes;
  for (int k = 0; k < S; ++k)
    pushes.push_back({k == own ? 0.0 : s[static_cast<std::size_t>(k)], 1, ready[static_cast<std::size_t>(k)]});
  const double backward = overlappable_s(in);
  const double pushed = std::max(backward, sent_by_s(in.link, pushes));
  const double replies = in.link.a * remote + in.link.b * S;
  const double cycle = (in.compute_s - backward) + pushed + replies + largest_update_s(in, *largest);
  // A round of n updates on the busiest node's link, each way: its worker's push to the other shards and
  // its shard's n - 1 replies (n pushes and n replies for a shard's node without a worker).
  double round = 0;
  if (n >= S) {
    for (int j = 0; j < n; ++j) {
      const double own = j < S ? s[static_cast<std::size_t>(j)] : 0.0;
      round = std::max(round, (all - own) + (n - 1) * own);
    }
  } else {
    round = std::max(all, n * *largest);
  }
  const double link_bound = in.link.a * round + in.link.b * n;
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
