#include "train/initial_state.hpp"

#include "model/flat_optimizer.hpp"
#include "train/job.hpp"

namespace troupe::train {

namespace {

/// Shard `i`'s start from `c`, written by `written_by` with `holders` shards.
holder_start shard_start(const net::checkpoint& c, uint32_t i, const std::string& algorithm, std::size_t shards) {
  holder_start h;
  if (c.optimizer_kind != algorithm)
    h.fresh = "the checkpoint was written by '" + c.optimizer_kind + "', not " + algorithm;
  else if (c.shard_versions.size() != shards)
    h.fresh = "the checkpoint has " + std::to_string(c.shard_versions.size()) + " shard(s), this run " +
              std::to_string(shards);
  if (!h.fresh.empty()) return h;
  h.version = c.shard_versions[i];
  h.state = net::shard_state(c, i);
  return h;
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
  for (uint32_t i = 0; i < p.shards.size(); ++i) st.shards[i] = shard_start(c, i, algorithm, p.shards.size());
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
