#include "train/bootstrap.hpp"

#include <cstdlib>
#include <iomanip>
#include <optional>
#include <iostream>
#include <ostream>
#include <sstream>

#include "model/cost_profile.hpp"
#include "model/scaling.hpp"
#include "net/checkpoint.hpp"
#include "net/message.hpp"
#include "train/cluster.hpp"
#include "train/job_file.hpp"
#include "train/profile_cache.hpp"

namespace troupe::train {

namespace {

/// Whether the job places its stages on devices (a placer or device speeds), not only cuts them.
bool places_stages(const settings& s) {
  return s.pipeline.stages > 1 && (s.pipeline.placement != placement_kind::even || !s.pipeline.device_speeds.empty());
}

/// The layers' costs of a placement measured with `threads` per stage: from
/// --profile-cache when it holds `key`, else measured (5 repetitions) and written there.
std::vector<model::layer_cost> measure_costs(const job& j, model::model& m, const std::string& key, int threads,
                                             std::ostream& log) {
  const settings& s = j.config();
  const std::string& path = s.pipeline.profile_cache;
  const std::string file_key = profile_key(key, "measured: 5 repetitions");
  std::string why;
  std::optional<std::vector<model::layer_cost>> costs =
      path.empty() ? std::nullopt : read_profile(path, file_key, m.size(), &why);
  if (!why.empty()) log << "warning: " << why << "; measuring again" << std::endl;
  if (costs) return std::move(*costs);
  const int updates = s.pipeline.schedule == pipeline_schedule::one_f_one_b ? s.pipeline.micro_batches : 1;
  const int64_t micro = std::max<int64_t>(1, s.batch_size / s.pipeline.micro_batches);
  std::vector<model::layer_cost> measured =
      model::measure_costs(m, micro, s.pipeline.micro_batches, kernels::context::with_threads(threads), 5, updates);
  if (!path.empty()) write_profile(path, file_key, measured);
  return measured;
}

/// A placer's input in one process: every layer's forward and backward time,
/// measured on a model of its own (not the one that trains: a measurement
/// would move batch norm's running statistics) with a stage's threads. None
/// where the stages are not placed: the plan then cuts by multiply-adds.
std::optional<std::vector<model::layer_cost>> measure_for_placement(const job& j, const loaded_data& data,
                                                                   const topology& topo, std::ostream& log) {
  const settings& s = j.config();
  if (!places_stages(s)) return std::nullopt;
  model::model m = build_model(j, data);
  const int threads = std::max(1, topo.nodes[0].threads / s.pipeline.stages);
  const int updates = s.pipeline.schedule == pipeline_schedule::one_f_one_b ? s.pipeline.micro_batches : 1;
  const int64_t micro = std::max<int64_t>(1, s.batch_size / s.pipeline.micro_batches);
  const std::string key = m.architecture() + "|" + std::to_string(micro) + "x" +
                          std::to_string(s.pipeline.micro_batches) + "|" + std::to_string(threads) + "|" +
                          std::to_string(updates);
  auto measure = [&] { return measure_costs(j, m, key, threads, log); };
  // Within the process: the caller's cache, when the job has one.
  return j.costs() ? j.costs()->get(key, measure) : measure();
}

/// A number in [0, 1] from `env`'s `key` into `into` (unchanged when unset).
void probability(const std::map<std::string, std::string>& env, const char* key, double& into) {
  auto it = env.find(key);
  if (it == env.end()) return;
  char* end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  if (*end || !(v >= 0 && v <= 1)) throw error(std::string(key) + " must be a probability in [0, 1], got '" + it->second + "'");
  into = v;
}

/// Faults to inject on this node's outgoing frames, for tests: off unless set in `env`.
net::fault_options faults_from(const std::map<std::string, std::string>& env) {
  net::fault_options f;
  probability(env, "TROUPE_FAULT_DROP", f.drop);
  probability(env, "TROUPE_FAULT_DELAY", f.delay);
  probability(env, "TROUPE_FAULT_DUPLICATE", f.duplicate);
  probability(env, "TROUPE_FAULT_DISCONNECT", f.disconnect);
  if (auto it = env.find("TROUPE_FAULT_SEED"); it != env.end()) f.seed = std::strtoull(it->second.c_str(), nullptr, 10);
  return f;
}

} // namespace

bool starting_point::finished() const { return state.first_epoch >= epochs; }

plan plan_of(const job& j, const cluster_spec& c, uint32_t self, model::model& net, const loaded_data& data,
             std::ostream& log) {
  const topology topo = topology_of(c, self, j.config().threads);
  const model::model::layer_profile profile = net.profile();
  const auto costs = topo.nodes.size() == 1 ? measure_for_placement(j, data, topo, log) : std::nullopt;
  return make_plan(j.config(), topo, net.layout(), data.train_samples(), &profile, costs ? &*costs : nullptr);
}

starting_point start_of(const job& j, const cluster_spec& c, uint32_t self, std::ostream& log) {
  starting_point start;
  start.epochs = j.config().epochs;
  start.data = std::make_shared<const loaded_data>(load_data(j, log));
  start.net = build_model(j, *start.data, resumes(j.config()));
  std::optional<net::checkpoint> checkpoint;
  if (resumes(j.config())) {
    const std::string& path = j.config().checkpoint;
    checkpoint = net::load_checkpoint(path);
    check_vocabulary(path, checkpoint->vocabulary, *start.data);
    start.net.load_state(checkpoint->architecture, checkpoint->params);
    log_resume(path, static_cast<int>(checkpoint->epoch), static_cast<int64_t>(checkpoint->step),
               static_cast<int64_t>(checkpoint->epoch_samples), start.data->train_samples(), log);
  }
  start.p = plan_of(j, c, self, start.net, *start.data, log);
  start.state = checkpoint ? resumed_start(*checkpoint, start.p, j.config()) : fresh_start(start.p);
  return start;
}

void log_plan(const job& j, const plan& p, const model::param_layout& layout, std::ostream& log) {
  const settings& s = j.config();
  if (!p.stages.empty()) {
    log << "model " << j.model_name() << ": " << layout.numel() << " parameters; ";
    if (p.pipeline_replicas > 1 || !p.shards.empty())
      log << p.pipeline_replicas << " replica(s) of a pipeline ("
          << (p.shards.empty() ? std::string("stage k of each allreduces with the others'")
                               : std::string(to_string(s.algo.kind)) + " on " + std::to_string(p.shards.size()) +
                                     " shard(s), one per stage with parameters")
          << ") of ";
    else
      log << "a pipeline of ";
    log << p.stages_per_replica() << " stages (" << model::to_string(s.pipeline.schedule) << ", "
        << s.pipeline.micro_batches << " micro-batches per mini-batch):";
    for (const auto& st : p.stages)
      log << " stage " << st.address.index << " on node " << st.address.node << ": layers [" << st.first_layer << ", "
          << st.last_layer << ") " << st.params.numel() << " parameters;";
    log << "\n";
    if (places_stages(s)) log << describe_placement(p, s, false);
    return;
  }
  log << "model " << j.model_name() << ": " << layout.numel() << " parameters; " << to_string(s.algo.kind) << " with "
      << p.workers.size() << " worker(s), "
      << (!p.worker_holders.empty() ? std::string("no shards (each worker reduces with the others)")
          : p.shards.empty()        ? std::string("one shared buffer")
                                    : std::to_string(p.shards.size()) + " shard(s)")
      << (p.shards.size() > 1 ? std::string(" ") + p.shard_cut.describe() +
                                    (s.algo.shard_cut == model::shard_cut::automatic ? " by --shard-cut auto" : "")
                              : std::string())
      << (traits(s.algo.kind).synchronous || traits(s.algo.kind).shared_memory  // --push-every is 1 there
              ? std::string()
              : ", push every " + std::to_string(s.algo.push_every))
      << ", " << p.workers.front().threads << " thread(s) per worker\n";
}

std::string job_identity(const job& j, const cluster_spec& c, const starting_point& start) {
  job_spec spec{j.model_name(), j.data_source().description(), j.config(), c};
  return "troupe schema " + std::to_string(wire::SCHEMA_VERSION) + "\n" + to_job_file(spec) + "architecture " +
         start.net.architecture() + "\nsamples " + std::to_string(start.data->train_samples()) + " / " +
         std::to_string(start.data->sets.test.count) + "\n";
}

net::transport_options link_options(const cluster_spec& c, uint32_t self, const std::string& secret,
                                    const std::string& job_hash, const std::map<std::string, std::string>& env) {
  net::transport_options to;
  to.self = self;
  for (const auto& n : c.nodes) to.nodes.push_back({n.name, n.host, n.port});
  to.secret = secret;
  to.job_hash = job_hash;
  to.heartbeat = std::chrono::milliseconds(static_cast<int64_t>(c.heartbeat_s * 1000));
  to.peer_timeout = std::chrono::milliseconds(static_cast<int64_t>(c.peer_timeout_s * 1000));
  to.encrypt = c.encrypt;
  to.lane_bytes = static_cast<std::size_t>(c.lane_mb) << 20;
  to.faults = faults_from(env);
  return to;
}

namespace {

/// A data-parallel job's predicted step (model/scaling.hpp) on its links
/// (--link-cost, else one process's), from one worker's compute measured here.
std::string predict_scaling(const job& j, model::model& net, const plan& p) {
  const settings& s = j.config();
  const algorithm_traits& t = traits(s.algo.kind);
  const int n = static_cast<int>(p.workers.size());
  model::scaling_inputs in;
  const kernels::context ctx = kernels::context::with_threads(p.workers[0].threads);
  model::set_compute(in, model::measure_costs(net, s.batch_size, 1, ctx, 3, 1));
  in.overlap_backward = t.collective || s.algo.overlap;  // linear execution pushes after backward
  const int64_t word = t.collective && s.algo.allreduce_dtype == reduce_dtype::bf16 ? 2 : 4;  // shards take f32
  in.param_bytes = static_cast<int64_t>(net.num_parameters()) * word;
  std::vector<int64_t> tensor_bytes;  // shards of whole tensors; empty: equal shares (model::shard_bytes)
  for (const model::parameter* q : net.parameters()) tensor_bytes.push_back(q->value.numel() * word);
  const bool even = p.shard_cut.cut == model::shard_cut::even;
  if (!even) in.tensor_bytes = tensor_bytes;
  in.bucket_bytes = static_cast<int64_t>(s.algo.bucket_mb * 1048576.0);
  const auto& lc = s.pipeline.link_cost;
  in.link = lc.size() == 2 ? model::link_cost{lc[0], lc[1]} : model::same_process_link();
  const int shards = std::max(1, static_cast<int>(p.shards.size()));
  auto estimate = [&](const model::scaling_inputs& x) {
    return t.collective ? model::allreduce_estimate(x, n)
           : t.synchronous ? model::ssgd_estimate(x, n, shards)
                           : model::asgd_estimate(x, n, shards);
  };
  const model::scaling_estimate e = estimate(in);
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(2);
  out << "predicted step (every worker one update, model/scaling.hpp; one worker per node, links "
      << (lc.size() == 2 ? "of --link-cost" : "of one process") << "): " << e.step_s * 1e3 << " ms, of which "
      << e.comm_s * 1e3 << " ms communication; efficiency " << std::setprecision(0) << e.efficiency * 100 << " %\n";
  if (t.shards && shards > 1 && p.shard_cut.imbalance > 0) {  // the other cut of the shards, for comparison
    model::scaling_inputs other = in;
    other.tensor_bytes = even ? tensor_bytes : std::vector<int64_t>{};
    const model::scaling_estimate o = estimate(other);
    out << std::setprecision(2) << "  with --shard-cut " << (even ? "tensors" : "even") << ": " << o.step_s * 1e3
        << " ms, of which " << o.comm_s * 1e3 << " ms communication\n";
  }
  return out.str();
}

} // namespace

std::string describe_plan(const job& j, bool json) {
  j.validate();
  const settings& s = j.config();
  const cluster_spec c = resolve(j.cluster_config(), environment());
  std::ostringstream log;
  const loaded_data data = load_data(j, log);
  model::model net = build_model(j, data);
  // The data's loading lines are not the plan's; a warning goes to stderr.
  const plan p = plan_of(j, c, 0, net, data, std::cerr);
  if (p.stages.empty()) {
    if (json) throw error("--json: the plan of a pipeline only (give --pipeline-stages K > 1)");
    const bool data_parallel = traits(s.algo.kind).on_actors && !p.workers.empty() && !p.shared_buffer;
    return p.describe() + (data_parallel ? predict_scaling(j, net, p) : std::string());
  }
  return describe_placement(p, s, json);
}

} // namespace troupe::train
