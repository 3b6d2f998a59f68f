#include "train/initial_state.hpp"

#include <algorithm>

#include "model/flat_optimizer.hpp"
#include "train/job.hpp"

namespace troupe::train {

namespace {

/// The checkpoint's shards' states, by shard.
std::vector<std::vector<named_tensor>> old_states(const net::checkpoint& c) {
  std::vector<std::vector<named_tensor>> old;
  for (uint32_t k = 0; k < c.shard_versions.size(); ++k) old.push_back(net::shard_state(c, k));
  return old;
}

const tensor* state_of(const std::vector<named_tensor>& state, const std::string& name) {
  for (const auto& t : state)
    if (t.name == name) return &t.value;
  return nullptr;
}

/// The checkpoint's shards' ranges of a layout of `numel` parameters: where the
/// parts of the first state that holds one value per parameter fall, joined in
/// the shards' order (0, end of shard 0, ..., numel); empty when no state does.
std::vector<int64_t> old_bounds(const std::vector<std::vector<named_tensor>>& old, int64_t numel) {
  for (const auto& t : old.empty() ? std::vector<named_tensor>{} : old[0]) {
    std::vector<int64_t> b{0};
    for (std::size_t k = 0; k < old.size() && b.size() == k + 1; ++k)
      if (const tensor* x = state_of(old[k], t.name)) b.push_back(b.back() + x->numel());
    if (b.size() == old.size() + 1 && b.back() == numel) return b;
  }
  return {};
}

/// The checkpoint's shards as a resumed run reads them: their states (old_states) and ranges (old_bounds).
struct old_shards {
  std::vector<std::vector<named_tensor>> states;
  std::vector<int64_t> bounds;
};

/// Shard range `r` from the states of the checkpoint's shards, another cut of
/// the same layout (other shards, or --shard-cut): each per-parameter state is
/// joined in the old shards' order and `r` taken, each scalar taken from the
/// old shard of the largest version among those `r` overlaps, which is also
/// the version. `fresh` set (and no state) when the old states do not fit that.
holder_start recut_start(const net::checkpoint& c, const old_shards& from, const model::shard_range& r,
                         const std::string& why) {
  holder_start h;
  const std::vector<std::vector<named_tensor>>& old = from.states;
  const std::vector<int64_t>& bounds = from.bounds;
  auto part = [&](uint32_t k, const std::string& name) { return state_of(old[k], name); };
  auto fail = [&](const std::string& what) {
    holder_start f;
    f.fresh = why + ", and " + what;
    return f;
  };
  if (old.empty() || old[0].empty()) return fail("no state to cut again");
  if (bounds.empty()) return fail("no state holds one value per parameter of the model");
  uint32_t newest = 0;  // the overlapped old shard of the largest version
  bool any = false;
  for (uint32_t k = 0; k < old.size(); ++k)
    if (bounds[k] < r.end && bounds[k + 1] > r.begin && (!any || c.shard_versions[k] > c.shard_versions[newest])) {
      newest = k;
      any = true;
    }
  h.version = c.shard_versions[newest];
  for (const auto& t : old[0]) {
    tensor joined = tensor::empty({r.numel()});
    bool scalar = true, per_parameter = true;
    for (uint32_t k = 0; k < old.size(); ++k) {
      const tensor* x = part(k, t.name);
      scalar = scalar && x && x->numel() == 1;
      per_parameter = per_parameter && x && x->numel() == bounds[k + 1] - bounds[k];
      if (!per_parameter) continue;
      const int64_t from = std::max(bounds[k], r.begin), to = std::min(bounds[k + 1], r.end);
      if (from < to) std::copy(x->data() + (from - bounds[k]), x->data() + (to - bounds[k]), joined.data() + (from - r.begin));
    }
    if (per_parameter) h.state.push_back({t.name, std::move(joined)});
    else if (scalar) h.state.push_back({t.name, part(newest, t.name)->clone()});
    else return fail("its state '" + t.name + "' is neither one value per parameter nor one value");
  }
  h.recut = why + ": its state cut again";
  return h;
}

/// Shard `i`'s start from `c`, written by `algorithm`: its own shard's state
/// when the checkpoint's shards (`old`) are this run's, else its part of theirs.
holder_start shard_start(const net::checkpoint& c, const old_shards& old, const plan& p, uint32_t i,
                         const std::string& algorithm) {
  holder_start h;
  if (c.optimizer_kind != algorithm) {
    h.fresh = "the checkpoint was written by '" + c.optimizer_kind + "', not " + algorithm;
    return h;
  }
  const model::shard_range& r = p.shards[i].range;
  if (c.shard_versions.size() == p.shards.size()) {
    // The same shards (or nothing tells otherwise): shard i's own.
    const std::vector<int64_t>& b = old.bounds;
    if (b.empty() || (b[i] == r.begin && b[i + 1] == r.end)) {
      h.version = c.shard_versions[i];
      h.state = old.states[i];
      return h;
    }
  }
  const std::string why = "the checkpoint has " + std::to_string(c.shard_versions.size()) + " shard(s), this run " +
                          std::to_string(p.shards.size()) +
                          (c.shard_versions.size() == p.shards.size() ? " cut otherwise" : "");
  return recut_start(c, old, r, why);
}

/// Stage `i`'s optimizer state `name` from `c` (the evaluator names a holder's
/// state "shard<i>/<name>"); `has_state`: the run's optimizer keeps some.
holder_start stage_start(const net::checkpoint& c, std::size_t i, std::size_t stages, const std::string& name,
                         bool has_state) {
  holder_start h;
  if (c.shard_versions.size() != stages) {
    h.fresh = "the checkpoint has " + std::to_string(c.shard_versions.size()) + " parameter holder(s), this run " +
              std::to_string(stages) + " stages";
    return h;
  }
  const std::string saved = "shard" + std::to_string(i) + "/" + name;
  for (const named_tensor& t : c.optimizer)
    if (t.name == saved) {
      h.state.push_back({name, t.value});
      return h;
    }
  if (has_state) h.fresh = "the checkpoint holds no " + name + " for it";
  return h;
}

} // namespace

initial_state fresh_start(const plan& p) {
  initial_state s;
  s.shards.resize(p.shards.size());
  s.stages.resize(p.stages.size());
  return s;
}

initial_state resumed_start(const net::checkpoint& c, const plan& p, const settings& s) {
  initial_state st = fresh_start(p);
  st.resuming = true;
  st.first_epoch = static_cast<int>(c.epoch);
  st.first_steps = static_cast<int64_t>(c.step);
  st.epoch_samples = static_cast<int64_t>(c.epoch_samples);
  if (st.epoch_samples >= p.samples_per_epoch) {
    st.epoch_samples_dropped = st.epoch_samples;
    st.epoch_samples = 0;
  }
  const std::string algorithm = to_string(s.algo.kind);
  if (!p.shards.empty()) {
    old_shards old{old_states(c), {}};
    old.bounds = old_bounds(old.states, p.shards.back().range.end);
    for (uint32_t i = 0; i < p.shards.size(); ++i) st.shards[i] = shard_start(c, old, p, i, algorithm);
  }
  const bool adamw = s.optimizer == optimizer_kind::adamw;  // a flat optimizer's state (model/flat_optimizer.hpp)
  const std::string name = model::flat_optimizer::state_name_of(adamw);
  const bool has_state = adamw || s.momentum != 0.0f;
  for (std::size_t i = 0; i < p.stages.size(); ++i)
    if (p.stages[i].shard < 0) st.stages[i] = stage_start(c, i, p.stages.size(), name, has_state);
  if (!p.worker_holders.empty()) {
    st.replicas = stage_start(c, 0, 1, name, has_state);
    if (st.replicas.fresh.empty()) st.replicas.version = c.shard_versions[0];
  }
  return st;
}

} // namespace troupe::train
