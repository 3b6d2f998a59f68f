#include "model/placement.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>

#include "tensor/error.hpp"

namespace troupe::model {

namespace {

constexpr double inf = std::numeric_limits<double>::infinity();
constexpr int max_subset_devices = 16;        // the 2^D dynamic programs
constexpr int64_t max_subset_states = 1 << 24;  // 2^D * (N + 1) entries

std::string fmt_bytes(int64_t b) {
  char buf[48];
  const double x = static_cast<double>(b);
  if (b < 1024) std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(b));
  else if (b < 1024 * 1024) std::snprintf(buf, sizeof buf, "%.4g KiB", x / 1024);
  else if (b < 1024 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.4g MiB", x / (1024 * 1024));
  else std::snprintf(buf, sizeof buf, "%.4g GiB", x / (1024 * 1024 * 1024));
  return buf;
}

std::string fmt_limit(int64_t b) { return b == 0 ? "unlimited" : fmt_bytes(b); }

bool finite_nonneg(double x) { return std::isfinite(x) && x >= 0; }

void check_inputs(const std::vector<layer_cost>& costs, const std::vector<device_cost>& devs, const link_cost& link,
                  const placement_options& o) {
  if (costs.empty()) throw error("placement: the chain has no layers");
  for (size_t i = 0; i < costs.size(); ++i) {
    const auto& l = costs[i];
    if (!finite_nonneg(l.fwd_s) || !finite_nonneg(l.bwd_s) || l.param_bytes < 0 || l.act_bytes < 0)
      throw error("placement: layer " + std::to_string(i) + " has a negative or non-finite cost");
  }
  if (devs.empty()) throw error("placement: no devices to place the stages on");
  for (const auto& d : devs) {
    if (!(d.speed > 0) || !std::isfinite(d.speed))
      throw error("placement: device " + d.name + ": speed must be > 0, got " + std::to_string(d.speed));
    if (d.memory_bytes < 0) throw error("placement: device " + d.name + ": a negative memory limit");
  }
  if (!finite_nonneg(link.a) || !finite_nonneg(link.b))
    throw error("placement: the link cost a * bytes + b needs a >= 0 and b >= 0");
  if (!finite_nonneg(o.memory_factor)) throw error("placement: memory_factor must be >= 0");
}

/// The chain's prefix sums and the devices, for one placement problem of K stages.
struct problem {
  const std::vector<layer_cost>& costs;
  const std::vector<device_cost>& devs;
  int n = 0, d = 0, k = 0;
  double factor = 3;
  std::vector<double> c, fw, bw, inv_speed;
  std::vector<int64_t> p, a;
  std::vector<double> comm;  // comm[e]: both transfers over a cut before layer e; 0 at e = 0 and e = n

  problem(const std::vector<layer_cost>& cs, const std::vector<device_cost>& ds, const link_cost& link,
          const placement_options& o, int stages)
      : costs(cs), devs(ds), n(static_cast<int>(cs.size())), d(static_cast<int>(ds.size())), factor(o.memory_factor) {
    check_inputs(cs, ds, link, o);
    k = stages > 0 ? stages : std::min(d, n);
    if (k > d)
      throw error("placement: " + std::to_string(k) + " stages need as many devices, there are " + std::to_string(d));
    if (k > n)
      throw error("placement: " + std::to_string(k) + " stages need as many layers, the chain has " +
                  std::to_string(n));
    c.assign(n + 1, 0);
    fw.assign(n + 1, 0);
    bw.assign(n + 1, 0);
    p.assign(n + 1, 0);
    a.assign(n + 1, 0);
    comm.assign(n + 1, 0);
    for (int i = 0; i < n; ++i) {
      fw[i + 1] = fw[i] + cs[i].fwd_s;
      bw[i + 1] = bw[i] + cs[i].bwd_s;
      c[i + 1] = c[i] + (cs[i].fwd_s + cs[i].bwd_s);
      p[i + 1] = p[i] + cs[i].param_bytes;
      a[i + 1] = a[i] + cs[i].act_bytes;
      if (i > 0) comm[i] = 2 * link.time(cs[i - 1].act_bytes);
    }
    for (const auto& dv : ds) inv_speed.push_back(1.0 / dv.speed);
  }
  int64_t memory(int j, int e) const {
    return static_cast<int64_t>(std::ceil(factor * static_cast<double>(p[e] - p[j]))) + (a[e] - a[j]);
  }
  int64_t limit(int dev) const {
    return devs[dev].memory_bytes == 0 ? std::numeric_limits<int64_t>::max() : devs[dev].memory_bytes;
  }
  bool fits(int j, int e, int dev) const { return memory(j, e) <= limit(dev); }
  double time(int j, int e, int dev) const { return (c[e] - c[j]) * inv_speed[dev] + comm[e]; }
  /// mf[j]: the last end e >= j such that layers [j, e) fit on `dev`.
  std::vector<int> maxfill(int dev) const {
    std::vector<int> mf(n + 1);
    int e = 0;
    for (int j = 0; j <= n; ++j) {
      e = std::max(e, j);
      while (e < n && fits(j, e + 1, dev)) ++e;
      mf[j] = e;
    }
    return mf;
  }
  double bottleneck(const std::vector<int>& bnd, const std::vector<int>& ord) const {
    double m = 0;
    for (int s = 0; s < k; ++s) m = std::max(m, time(bnd[s], bnd[s + 1], ord[s]));
    return m;
  }
};

/// Throws the error that says why no placement of `pb` fits its memory limits.
[[noreturn]] void throw_no_fit(const problem& pb) {
  std::vector<int> by_mem(pb.d);
  std::iota(by_mem.begin(), by_mem.end(), 0);
  std::stable_sort(by_mem.begin(), by_mem.end(), [&](int x, int y) { return pb.limit(x) > pb.limit(y); });
  const int big = by_mem[0];
  int worst = 0;
  for (int i = 1; i < pb.n; ++i)
    if (pb.memory(i, i + 1) > pb.memory(worst, worst + 1)) worst = i;
  const int64_t alone = pb.memory(worst, worst + 1);
  if (alone > pb.limit(big))
    throw error("placement: no valid placement: device " + pb.devs[big].name + " (limit " +
                fmt_bytes(pb.limit(big)) + ", the largest) would need at least " + fmt_bytes(alone) + " for layer " +
                std::to_string(worst) + " alone, short of " + fmt_bytes(alone - pb.limit(big)) +
                "; give a device more memory or lower the memory factor");
  int64_t held = 0;
  std::string names;
  for (int s = 0; s < pb.k; ++s) {
    if (pb.devs[by_mem[s]].memory_bytes == 0) break;
    held += pb.limit(by_mem[s]);
    names += (s ? ", " : "") + pb.devs[by_mem[s]].name;
    if (s == pb.k - 1 && pb.memory(0, pb.n) > held)
      throw error("placement: no valid placement: the " + std::to_string(pb.k) + " stages need at least " +
                  fmt_bytes(pb.memory(0, pb.n)) + " in all, the " + std::to_string(pb.k) + " largest devices (" +
                  names + ") hold " + fmt_bytes(held) + ", short of " + fmt_bytes(pb.memory(0, pb.n) - held) +
                  "; give the devices more memory or use more stages");
  }
  throw error("placement: no valid placement: no split of the " + std::to_string(pb.n) + " layers into " +
              std::to_string(pb.k) + " contiguous stages fits the devices' memory limits (the largest, " +
              pb.devs[big].name + ", holds " + fmt_limit(pb.devs[big].memory_bytes) +
              "); give the devices more memory or change the number of stages");
}

/// Some K devices, in order, that can hold the chain within their memory
/// limits (dynamic programming over (device subset, layers placed)); empty if
/// none can. Throws where the problem is too large for it.
std::vector<int> feasible_order(const problem& pb) {
  const int n = pb.n, d = pb.d, k = pb.k;
  if (d > max_subset_devices || (int64_t{1} << d) * (n + 1) > max_subset_states)
    throw error("placement: no order of the fastest devices fits the memory limits, and " + std::to_string(d) +
                " devices are too many to search every order; give the devices more memory");
  const int64_t row = n + 1;
  std::vector<uint8_t> reach((size_t{1} << d) * row, 0);
  reach[0] = 1;
  std::vector<std::vector<int>> mf;
  for (int dev = 0; dev < d; ++dev) mf.push_back(pb.maxfill(dev));
  for (uint32_t s = 0; s < (1u << d); ++s) {
    const int used = __builtin_popcount(s);
    if (used >= k) continue;
    const int emax = n - (k - used - 1);
    for (int dev = 0; dev < d; ++dev) {
      if (s & (1u << dev)) continue;
      uint8_t* to = &reach[(s | (1u << dev)) * row];
      int marked = 0;  // ends up to here are marked already
      for (int j = used; j < emax; ++j) {
        if (!reach[s * row + j]) continue;
        const int hi = std::min(mf[dev][j], emax);
        for (int e = std::max(marked, j) + 1; e <= hi; ++e) to[e] = 1;
        marked = std::max(marked, hi);
      }
    }
  }
  // Walk back from any full set that reaches the chain's end.
  for (uint32_t s = 0; s < (1u << d); ++s) {
    if (__builtin_popcount(s) != k || !reach[s * row + n]) continue;
    std::vector<int> ord;
    uint32_t set = s;
    int e = n;
    while (set) {
      bool found = false;
      for (int dev = 0; dev < d && !found; ++dev) {
        if (!(set & (1u << dev))) continue;
        const uint32_t prev = set & ~(1u << dev);
        for (int j = e - 1; j >= 0 && !found; --j)
          if (reach[prev * row + j] && (prev != 0 || j == 0) && mf[dev][j] >= e) {
            ord.push_back(dev);
            set = prev;
            e = j;
            found = true;
          }
      }
      if (!found) break;  // cannot happen: every reached state has a predecessor
    }
    std::reverse(ord.begin(), ord.end());
    return ord;
  }
  return {};
}

// --- greedy --------------------------------------------------------------

/// Whether layers [j, N) fit on devices ord[s..K-1] as non-empty stages
/// (memory only); `relaxed` answers yes without looking (a quick first test).
struct suffix_fits {
  int row = 0;
  bool relaxed = false;
  std::vector<uint8_t> ok;
  bool operator()(int s, int j) const { return relaxed || ok[static_cast<size_t>(s) * row + j]; }

  suffix_fits() : relaxed(true) {}
  suffix_fits(const problem& pb, const std::vector<int>& ord, const std::vector<std::vector<int>>& mf)
      : row(pb.n + 1), ok(static_cast<size_t>(pb.k + 1) * row, 0) {
    const int n = pb.n;
    ok[static_cast<size_t>(pb.k) * row + n] = 1;
    std::vector<int> next(n + 2);  // next[e]: the least e' >= e with ok(s + 1, e'), n + 1 if none
    for (int s = pb.k - 1; s >= 0; --s) {
      const uint8_t* after = &ok[static_cast<size_t>(s + 1) * row];
      next[n + 1] = n + 1;
      for (int e = n; e >= 0; --e) next[e] = after[e] ? e : next[e + 1];
      uint8_t* here = &ok[static_cast<size_t>(s) * row];
      for (int j = 0; j < n; ++j) here[j] = next[j + 1] <= mf[ord[s]][j];
    }
  }
};

/// Walks the layers filling each device of `ord` up to its share (see place_greedy).
std::vector<int> walk(const problem& pb, const std::vector<int>& ord, const suffix_fits& ok,
                      const std::vector<std::vector<int>>& mf) {
  const int n = pb.n, k = pb.k;
  std::vector<int> bnd(k + 1, 0);
  bnd[k] = n;
  double speed_left = 0;
  for (int dev : ord) speed_left += pb.devs[dev].speed;
  int j = 0;
  for (int s = 0; s + 1 < k; ++s) {
    const int dev = ord[s];
    const double speed_rest = speed_left - pb.devs[dev].speed;
    const double target = pb.c[j] + (pb.c[n] - pb.c[j]) * pb.devs[dev].speed / speed_left;
    const auto allowed = [&](int e) { return e > j && e <= mf[dev][j] && ok(s + 1, e); };
    // e1 takes the layer where the share ends, e0 leaves it to the next stage.
    int e1 = static_cast<int>(std::lower_bound(pb.c.begin() + j + 1, pb.c.end(), target) - pb.c.begin());
    e1 = std::min(e1, n);
    int e0 = e1 - 1;
    while (e0 > j && !allowed(e0)) --e0;
    while (e1 <= n && !allowed(e1)) ++e1;
    int best = -1;
    double best_score = inf;
    for (int e : {e0, e1}) {
      if (e <= j || e > n || !allowed(e)) continue;
      const double rest = speed_rest > 0 ? (pb.c[n] - pb.c[e]) / speed_rest : 0;
      const double score = std::max(pb.time(j, e, dev), rest);
      if (score < best_score) best = e, best_score = score;
    }
    bnd[s + 1] = j = best;  // ok(s, j) holds, so some end is allowed
    speed_left = speed_rest;
  }
  return bnd;
}

/// Moves a cut of the bottleneck stage by one layer while that lowers it.
void local_search(const problem& pb, const std::vector<int>& ord, std::vector<int>& bnd,
                  const std::vector<std::vector<int>>& mf) {
  const int k = pb.k;
  std::vector<double> t(k);
  for (int s = 0; s < k; ++s) t[s] = pb.time(bnd[s], bnd[s + 1], ord[s]);
  for (int64_t round = 0; round < int64_t{4} * pb.n * k; ++round) {
    const int b = static_cast<int>(std::max_element(t.begin(), t.end()) - t.begin());
    double best = t[b];
    int cut = -1, to = 0;
    if (b + 1 < k && bnd[b + 1] - 1 > bnd[b]) {  // its last layer to the next stage
      const int e = bnd[b + 1] - 1;
      if (mf[ord[b + 1]][e] >= bnd[b + 2]) {
        const double m = std::max(pb.time(bnd[b], e, ord[b]), pb.time(e, bnd[b + 2], ord[b + 1]));
        if (m < best) best = m, cut = b + 1, to = e;
      }
    }
    if (b > 0 && bnd[b] + 1 < bnd[b + 1]) {  // its first layer to the previous stage
      const int e = bnd[b] + 1;
      if (mf[ord[b - 1]][bnd[b - 1]] >= e) {
        const double m = std::max(pb.time(bnd[b - 1], e, ord[b - 1]), pb.time(e, bnd[b + 1], ord[b]));
        if (m < best) best = m, cut = b, to = e;
      }
    }
    if (cut < 0) return;
    bnd[cut] = to;
    t[cut - 1] = pb.time(bnd[cut - 1], bnd[cut], ord[cut - 1]);
    t[cut] = pb.time(bnd[cut], bnd[cut + 1], ord[cut]);
  }
}

/// Fills each device of `ord` in turn with as many layers as keep its stage
/// within `tau` (time and transfer), leaving the rest able to fit the memory
/// and every later stage at least one layer; false where the chain is not covered.
bool fill(const problem& pb, const std::vector<int>& ord, const suffix_fits& ok,
          const std::vector<std::vector<int>>& mf, double tau, std::vector<int>& bnd) {
  const int n = pb.n, k = pb.k;
  int j = 0;
  for (int s = 0; s + 1 < k; ++s) {
    const int dev = ord[s], emax = std::min(mf[dev][j], n - (k - s - 1));
    int best = -1;
    for (int e = j + 1; e <= emax; ++e) {
      if ((pb.c[e] - pb.c[j]) * pb.inv_speed[dev] > tau) break;
      if (ok(s + 1, e) && pb.time(j, e, dev) <= tau) best = e;
    }
    if (best < 0) return false;
    bnd[s + 1] = j = best;
  }
  return mf[ord[k - 1]][j] >= n && pb.time(j, n, ord[k - 1]) <= tau;
}

/// The cuts fill() finds at the least tau <= hi (bisection: the shares
/// scaled down until the devices no longer hold the chain); empty where
/// fill(hi) fails.
std::vector<int> least_fill(const problem& pb, const std::vector<int>& ord, const suffix_fits& ok,
                            const std::vector<std::vector<int>>& mf, double hi) {
  std::vector<int> trial(pb.k + 1, 0), best;
  trial[pb.k] = pb.n;
  if (!ok(0, 0) || !fill(pb, ord, ok, mf, hi, trial)) return best;
  best = trial;
  for (double lo = 0; hi - lo > 1e-9 * hi;) {
    const double mid = (lo + hi) / 2;
    if (fill(pb, ord, ok, mf, mid, trial)) {
      hi = mid;
      best = trial;
    } else {
      lo = mid;
    }
  }
  return best;
}

/// Kuhn's augmenting path for stage s over edges of cost <= limit.
bool augment(int s, double limit, const std::vector<std::vector<double>>& cost, std::vector<int>& owner,
             std::vector<uint8_t>& seen) {
  for (size_t dev = 0; dev < owner.size(); ++dev) {
    if (cost[s][dev] > limit || seen[dev]) continue;
    seen[dev] = 1;
    if (owner[dev] < 0 || augment(owner[dev], limit, cost, owner, seen)) {
      owner[dev] = s;
      return true;
    }
  }
  return false;
}

/// The devices for the stages `bnd` (any K of them, distinct) of least bottleneck; empty if none fit.
std::vector<int> match_devices(const problem& pb, const std::vector<int>& bnd) {
  std::vector<std::vector<double>> cost(pb.k, std::vector<double>(pb.d, inf));
  std::vector<double> values;
  for (int s = 0; s < pb.k; ++s)
    for (int dev = 0; dev < pb.d; ++dev)
      if (pb.fits(bnd[s], bnd[s + 1], dev)) values.push_back(cost[s][dev] = pb.time(bnd[s], bnd[s + 1], dev));
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  std::vector<int> owner, best;
  size_t lo = 0, hi = values.size();  // the least value index whose edges match every stage
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    owner.assign(pb.d, -1);
    bool all = true;
    for (int s = 0; s < pb.k && all; ++s) {
      std::vector<uint8_t> seen(pb.d, 0);
      all = augment(s, values[mid], cost, owner, seen);
    }
    if (all) {
      hi = mid;
      best.assign(pb.k, -1);
      for (int dev = 0; dev < pb.d; ++dev)
        if (owner[dev] >= 0) best[owner[dev]] = dev;
    } else {
      lo = mid + 1;
    }
  }
  return best;
}

struct candidate {
  std::vector<int> bnd, ord;
  double value = inf;
};

/// The greedy walk (and local search) for one device order; value inf where the order cannot fit.
candidate place_order(const problem& pb, const std::vector<int>& ord, const std::vector<std::vector<int>>& mf,
                      bool search) {
  candidate c;
  const auto ok = suffix_fits(pb, ord, mf);
  if (!ok(0, 0)) return c;
  c.ord = ord;
  c.bnd = walk(pb, ord, ok, mf);
  if (search) {
    if (auto better = least_fill(pb, ord, ok, mf, pb.bottleneck(c.bnd, ord)); !better.empty()) c.bnd = better;
    local_search(pb, ord, c.bnd, mf);
  }
  c.value = pb.bottleneck(c.bnd, ord);
  return c;
}

/// The cuts fill() finds for `ord` at the least tau below `bound` (bisection),
/// then local_search; value inf where no tau below `bound` covers the chain.
candidate cuts_below(const problem& pb, const std::vector<int>& ord, const std::vector<std::vector<int>>& mf,
                     double bound) {
  candidate c;
  const double hi = bound * (1 - 1e-9);
  std::vector<int> bnd(pb.k + 1, 0);
  bnd[pb.k] = pb.n;
  if (!fill(pb, ord, suffix_fits(), mf, hi, bnd)) return c;  // fails even without the rest's memory: cheap reject
  c.bnd = least_fill(pb, ord, suffix_fits(pb, ord, mf), mf, hi);
  if (c.bnd.empty()) return c;
  local_search(pb, ord, c.bnd, mf);
  c.ord = ord;
  c.value = pb.bottleneck(c.bnd, ord);
  return c;
}

/// Swaps the devices of two stages, or a stage's device for an unused one,
/// and cuts anew: the first change that lowers the bottleneck replaces `best`.
bool swap_devices(const problem& pb, const std::vector<std::vector<int>>& mf, candidate& best) {
  std::vector<uint8_t> used(pb.d, 0);
  for (int dev : best.ord) used[dev] = 1;
  for (int i = 0; i < pb.k; ++i)
    for (int other = 0; other < pb.d; ++other) {
      auto ord = best.ord;
      const auto at = std::find(ord.begin(), ord.end(), other) - ord.begin();
      if (at <= i && used[other]) continue;  // each pair once; a device for itself never
      if (used[other]) std::swap(ord[i], ord[at]);
      else ord[i] = other;
      if (auto c = cuts_below(pb, ord, mf, best.value); c.value < best.value) {
        best = std::move(c);
        return true;
      }
    }
  for (int i = 0; i < pb.k; ++i)  // stage i's device moved to position j, the others shifted
    for (int j = 0; j < pb.k; ++j) {
      if (j == i || j == i - 1 || j == i + 1) continue;  // no change, or a swap of neighbours (done above)
      auto ord = best.ord;
      const int dev = ord[i];
      ord.erase(ord.begin() + i);
      ord.insert(ord.begin() + j, dev);
      if (auto c = cuts_below(pb, ord, mf, best.value); c.value < best.value) {
        best = std::move(c);
        return true;
      }
    }
  return false;
}

placement to_placement(const std::vector<int>& bnd, const std::vector<int>& ord) {
  placement p;
  p.cuts.assign(bnd.begin() + 1, bnd.end() - 1);
  p.devices = ord;
  return p;
}

/// Throws for a placement that is malformed for `pb`'s chain and devices.
void check_structure(const problem& pb, const placement& p) {
  const int k = static_cast<int>(p.devices.size());
  if (k < 1) throw error("placement: no stages (one device index per stage is needed)");
  if (static_cast<int>(p.cuts.size()) != k - 1)
    throw error("placement: " + std::to_string(k) + " stages need " + std::to_string(k - 1) + " cuts, got " +
                std::to_string(p.cuts.size()) + " (" + to_string(p) + ")");
  for (int s = 0; s + 1 < k; ++s) {
    const int cut = p.cuts[s];
    if (cut < 1 || cut > pb.n - 1)
      throw error("placement: cut " + std::to_string(cut) + " outside [1, " + std::to_string(pb.n - 1) +
                  "] (a cut is the first layer of a stage; the chain has " + std::to_string(pb.n) + " layers)");
    if (s > 0 && cut <= p.cuts[s - 1])
      throw error("placement: cuts must increase strictly (" + to_string(p) + ")");
  }
  std::vector<uint8_t> used(pb.d, 0);
  for (int dev : p.devices) {
    if (dev < 0 || dev >= pb.d)
      throw error("placement: device index " + std::to_string(dev) + " outside [0, " + std::to_string(pb.d) + ")");
    if (used[dev]) throw error("placement: device " + pb.devs[dev].name + " holds two stages (" + to_string(p) + ")");
    used[dev] = 1;
  }
}

std::vector<int> boundaries(const problem& pb, const placement& p) {
  std::vector<int> bnd{0};
  bnd.insert(bnd.end(), p.cuts.begin(), p.cuts.end());
  bnd.push_back(pb.n);
  return bnd;
}

/// Re-matches devices to the stages of `c` (exact for its cuts), cuts anew for
/// the matched order, and moves devices (swap_devices), while that helps.
void reorder(const problem& pb, const std::vector<std::vector<int>>& mf, bool refine, candidate& c) {
  for (int round = 0; round < 4 * pb.k * pb.d; ++round) {
    const auto ord = match_devices(pb, c.bnd);
    if (ord.empty()) return;
    bool better = false;
    if (const double v = pb.bottleneck(c.bnd, ord); v < c.value) {
      c = {c.bnd, ord, v};
      better = true;
    }
    if (auto next = place_order(pb, ord, mf, refine); next.value < c.value) {
      c = std::move(next);
      better = true;
    }
    if (!better && !swap_devices(pb, mf, c)) return;
  }
}

/// f[set * (N + 1) + j]: the least bottleneck of layers [0, j) on exactly the
/// devices in `set`, each stage on its own device (inf where none fits).
std::vector<double> optimal_table(const problem& pb, const std::vector<std::vector<int>>& mf) {
  const int n = pb.n, d = pb.d, k = pb.k;
  const size_t row = n + 1;
  std::vector<double> f((size_t{1} << d) * row, inf);
  f[0] = 0;
  for (uint32_t s = 0; s < (1u << d); ++s) {
    const int used = __builtin_popcount(s);
    if (used >= k) continue;
    const int emax = n - (k - used - 1);  // every later stage keeps a layer
    for (int j = used; j < emax; ++j) {
      const double v = f[s * row + j];
      if (v == inf) continue;
      for (int dev = 0; dev < d; ++dev) {
        if (s & (1u << dev)) continue;
        double* to = &f[(s | (1u << dev)) * row];
        const int hi = std::min(mf[dev][j], emax);
        const int lo = used + 1 == k ? emax : j + 1;  // the last stage must end the chain
        for (int e = lo; e <= hi; ++e) {
          const double m = std::max(v, pb.time(j, e, dev));
          if (m < to[e]) to[e] = m;
        }
      }
    }
  }
  return f;
}

/// The placement behind f[set][N]: at each step back, a stage that attains the value.
placement walk_back(const problem& pb, const std::vector<std::vector<int>>& mf, const std::vector<double>& f,
                    uint32_t set) {
  const size_t row = pb.n + 1;
  std::vector<int> bnd{pb.n}, ord;
  while (set) {
    const int e = bnd.back();
    const double v = f[set * row + e];
    bool found = false;
    for (int dev = 0; dev < pb.d && !found; ++dev) {
      if (!(set & (1u << dev))) continue;
      const uint32_t prev = set & ~(1u << dev);
      for (int j = e - 1; j >= 0 && !found; --j)
        if (f[prev * row + j] <= v && mf[dev][j] >= e && pb.time(j, e, dev) <= v) {
          ord.push_back(dev);
          bnd.push_back(j);
          set = prev;
          found = true;
        }
    }
    if (!found) throw error("placement: optimal: internal error walking back the table");
  }
  std::reverse(bnd.begin(), bnd.end());
  std::reverse(ord.begin(), ord.end());
  return to_placement(bnd, ord);
}

} // namespace

link_cost fit_link(const std::vector<std::pair<int64_t, double>>& pts) {
  if (pts.size() < 2)
    throw error("fit_link: needs timings at two different sizes at least, got " + std::to_string(pts.size()) +
                " point(s)");
  const double n = static_cast<double>(pts.size());
  double mx = 0, my = 0;
  for (const auto& [x, y] : pts) mx += static_cast<double>(x) / n, my += y / n;
  double sxx = 0, sxy = 0, xx = 0, xy = 0;
  for (const auto& [x, y] : pts) {
    const double dx = static_cast<double>(x) - mx;
    sxx += dx * dx;
    sxy += dx * (y - my);
    xx += static_cast<double>(x) * static_cast<double>(x);
    xy += static_cast<double>(x) * y;
  }
  if (!(sxx > 0)) throw error("fit_link: every timing is at the same size; time at two sizes at least");
  link_cost l{sxy / sxx, my - sxy / sxx * mx};
  if (l.b < 0) l = {xy / xx, 0};
  if (l.a < 0) l = {0, std::max(0.0, my)};
  return l;
}

std::string to_string(const placement& p) {
  std::string s = "cuts [";
  for (size_t i = 0; i < p.cuts.size(); ++i) s += (i ? " " : "") + std::to_string(p.cuts[i]);
  s += "] devices [";
  for (size_t i = 0; i < p.devices.size(); ++i) s += (i ? " " : "") + std::to_string(p.devices[i]);
  return s + "]";
}

const char* to_string(placer_kind k) {
  switch (k) {
    case placer_kind::random: return "random";
    case placer_kind::greedy: return "greedy";
    case placer_kind::optimal: return "optimal";
    case placer_kind::manual: return "manual";
  }
  return "?";
}

placer_kind parse_placer(const std::string& name) {
  for (auto k : {placer_kind::random, placer_kind::greedy, placer_kind::optimal, placer_kind::manual})
    if (name == to_string(k)) return k;
  throw error("unknown placement '" + name + "' (random, greedy, optimal or manual)");
}

int64_t stage_memory(const std::vector<layer_cost>& costs, int first, int last, double memory_factor) {
  if (first < 0 || last > static_cast<int>(costs.size()) || first > last)
    throw error("stage_memory: layers [" + std::to_string(first) + ", " + std::to_string(last) + ") outside the chain");
  int64_t params = 0, acts = 0;
  for (int i = first; i < last; ++i) params += costs[i].param_bytes, acts += costs[i].act_bytes;
  return static_cast<int64_t>(std::ceil(memory_factor * static_cast<double>(params))) + acts;
}

placement_estimate evaluate(const std::vector<layer_cost>& costs, const std::vector<device_cost>& devices,
                            const link_cost& link, const placement& p, const placement_options& o) {
  const int k = static_cast<int>(p.devices.size());
  const problem pb(costs, devices, link, o, std::max(1, std::min<int>(k, std::min(costs.size(), devices.size()))));
  check_structure(pb, p);
  const auto bnd = boundaries(pb, p);
  placement_estimate r;
  for (int s = 0; s < k; ++s) {
    const int j = bnd[s], e = bnd[s + 1], dev = p.devices[s];
    stage_estimate st;
    st.first = j;
    st.last = e;
    st.device = dev;
    st.fwd_s = (pb.fw[e] - pb.fw[j]) * pb.inv_speed[dev];
    st.bwd_s = (pb.bw[e] - pb.bw[j]) * pb.inv_speed[dev];
    st.transfer_s = pb.comm[e];
    st.time_s = pb.time(j, e, dev);
    st.send_bytes = e < pb.n ? costs[e - 1].act_bytes : 0;
    st.memory_bytes = pb.memory(j, e);
    st.fits = st.memory_bytes <= pb.limit(dev);
    r.fits = r.fits && st.fits;
    if (st.time_s > (r.stages.empty() ? -1.0 : r.step_s)) r.bottleneck = s, r.step_s = st.time_s;
    r.stages.push_back(st);
  }
  return r;
}

placement place_manual(const std::vector<layer_cost>& costs, const std::vector<device_cost>& devices,
                       const placement& p, const placement_options& o) {
  const auto r = evaluate(costs, devices, link_cost{}, p, o);
  for (size_t s = 0; s < r.stages.size(); ++s) {
    const auto& st = r.stages[s];
    if (st.fits) continue;
    const auto& dv = devices[st.device];
    throw error("placement: stage " + std::to_string(s) + " (layers " + std::to_string(st.first) + ".." +
                std::to_string(st.last - 1) + ") needs " + fmt_bytes(st.memory_bytes) + " on device " + dv.name +
                " (limit " + fmt_bytes(dv.memory_bytes) + "), short of " +
                fmt_bytes(st.memory_bytes - dv.memory_bytes) + "; move its cuts or give it a larger device");
  }
  return p;
}

placement place_random(const std::vector<layer_cost>& costs, const std::vector<device_cost>& devices,
                       const link_cost& link, const placement_options& o) {
  const problem pb(costs, devices, link, o, o.stages);
  std::mt19937_64 rng(o.seed);
  std::vector<int> points(pb.n - 1), devs(pb.d);
  for (int t = 0; t < std::max(1, o.random_tries); ++t) {
    std::iota(points.begin(), points.end(), 1);
    std::iota(devs.begin(), devs.end(), 0);
    // Partial Fisher-Yates: the first K-1 points and the first K devices are a uniform draw.
    for (int i = 0; i + 1 < pb.k; ++i)
      std::swap(points[i], points[std::uniform_int_distribution<int>(i, pb.n - 2)(rng)]);
    for (int i = 0; i < pb.k; ++i) std::swap(devs[i], devs[std::uniform_int_distribution<int>(i, pb.d - 1)(rng)]);
    placement p;
    p.cuts.assign(points.begin(), points.begin() + (pb.k - 1));
    std::sort(p.cuts.begin(), p.cuts.end());
    p.devices.assign(devs.begin(), devs.begin() + pb.k);
    const auto bnd = boundaries(pb, p);
    bool fit = true;
    for (int s = 0; s < pb.k && fit; ++s) fit = pb.fits(bnd[s], bnd[s + 1], p.devices[s]);
    if (fit) return p;
  }
  if (feasible_order(pb).empty()) throw_no_fit(pb);
  throw error("placement: random: none of " + std::to_string(o.random_tries) +
              " draws fits the devices' memory limits (few placements fit); use greedy or optimal");
}

placement place_greedy(const std::vector<layer_cost>& costs, const std::vector<device_cost>& devices,
                       const link_cost& link, const placement_options& o) {
  const problem pb(costs, devices, link, o, o.stages);
  std::vector<std::vector<int>> mf;
  for (int dev = 0; dev < pb.d; ++dev) mf.push_back(pb.maxfill(dev));
  std::vector<int> fastest(pb.d);
  std::iota(fastest.begin(), fastest.end(), 0);
  std::stable_sort(fastest.begin(), fastest.end(), [&](int x, int y) {
    if (devices[x].speed != devices[y].speed) return devices[x].speed > devices[y].speed;
    return pb.limit(x) > pb.limit(y);
  });
  fastest.resize(pb.k);
  std::vector<int> ascending(fastest.rbegin(), fastest.rend()), given = fastest;
  std::sort(given.begin(), given.end());
  std::vector<candidate> starts;
  for (const auto* ord : {&fastest, &ascending, &given})
    if (auto c = place_order(pb, *ord, mf, o.refine); c.value < inf) starts.push_back(std::move(c));
  if (starts.empty()) {
    const auto ord = feasible_order(pb);
    if (ord.empty()) throw_no_fit(pb);
    starts.push_back(place_order(pb, ord, mf, o.refine));
  }
  candidate best;
  for (auto& c : starts) {
    if (o.reorder) reorder(pb, mf, o.refine, c);
    if (c.value < best.value) best = std::move(c);
  }
  return to_placement(best.bnd, best.ord);
}

placement place_optimal(const std::vector<layer_cost>& costs, const std::vector<device_cost>& devices,
                        const link_cost& link, const placement_options& o) {
  const problem pb(costs, devices, link, o, o.stages);
  if (pb.d > max_subset_devices || (int64_t{1} << pb.d) * (pb.n + 1) > max_subset_states)
    throw error("placement: optimal: " + std::to_string(pb.d) + " devices and " + std::to_string(pb.n) +
                " layers are too many for the exact search (2^devices * layers states); use greedy");
  std::vector<std::vector<int>> mf;
  for (int dev = 0; dev < pb.d; ++dev) mf.push_back(pb.maxfill(dev));
  const std::vector<double> f = optimal_table(pb, mf);
  uint32_t best_set = 0;
  double best = inf;
  for (uint32_t s = 0; s < (1u << pb.d); ++s) {
    const double v = f[s * (pb.n + 1) + pb.n];
    if (__builtin_popcount(s) == pb.k && v < best) best = v, best_set = s;
  }
  if (best == inf) throw_no_fit(pb);
  return walk_back(pb, mf, f, best_set);
}

} // namespace troupe::model
