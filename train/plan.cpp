#include "train/plan.hpp"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/cost_profile.hpp"
#include "tensor/error.hpp"
#include "train/cluster.hpp"

namespace troupe::train {

namespace {

/// The indices of the nodes that `allowed` accepts; throws when there are none.
std::vector<uint32_t> eligible(const topology& t, bool node_spec::*allowed, const char* what) {
  std::vector<uint32_t> out;
  for (std::size_t i = 0; i < t.nodes.size(); ++i)
    if (t.nodes[i].*allowed) out.push_back(static_cast<uint32_t>(i));
  if (out.empty()) throw error(std::string("no node of the topology may run ") + what);
  return out;
}

int64_t batches(int64_t samples, int64_t batch_size) { return (samples + batch_size - 1) / batch_size; }

} // namespace

topology topology::local(int threads) {
  if (threads <= 0) threads = default_threads(environment(), usable_cores());
  topology t;
  t.nodes.push_back({"local", threads, true, true, {}});
  return t;
}

uint32_t plan::shard_of(std::size_t tensor) const {
  for (std::size_t s = 0; s < shards.size(); ++s)
    if (shards[s].range.holds(tensor)) return static_cast<uint32_t>(s);
  throw error("plan: no shard holds parameter tensor " + std::to_string(tensor));
}

std::string plan::describe() const {
  std::ostringstream os;
  for (std::size_t n = 0; n < nodes.size(); ++n)
    os << "node " << n << ": " << nodes[n].workers << " worker(s), " << nodes[n].shards << " shard(s), "
       << nodes[n].scheduler_threads << " scheduler thread(s)\n";
  for (std::size_t i = 0; i < workers.size(); ++i)
    os << "  " << net::to_string(workers[i].address) << ": samples [" << loaders[i].begin << ", " << loaders[i].end
       << "), " << workers[i].threads << " thread(s)" << (workers[i].speed > 1 ? ", " : "")
       << (workers[i].speed > 1 ? std::to_string(workers[i].speed) + "x slower" : "") << "\n";
  for (const auto& s : shards)
    os << "  " << net::to_string(s.address) << ": tensors [" << s.range.first << ", " << s.range.last << "), "
       << s.range.numel() << " parameters [" << s.range.begin << ", " << s.range.end << ")" << (s.stage >= 0 ? ", of stage " + std::to_string(s.stage) : "")
       << "\n";
  if (shards.size() > 1 && stages.empty()) os << "  shards: " << shard_cut.describe() << "\n";
  if (pipeline_replicas > 1)
    for (std::size_t r = 0; r < loaders.size(); ++r)
      os << "  pipeline replica " << r << ": samples [" << loaders[r].begin << ", " << loaders[r].end << ")\n";
  return os.str();
}

uint32_t plan::replica_of(const net::address& a) const {
  return a.role == net::role::stage ? a.index / static_cast<uint32_t>(std::max(1, stages_per_replica())) : a.index;
}

std::vector<shard_plan> plan::parameter_holders() const {
  if (!worker_holders.empty()) return worker_holders;
  if (stages.empty() || !shards.empty()) return shards;
  // Every stage of the first replica (the others hold the same after an allreduce), those without
  // parameters too: index k is stage k.
  std::vector<shard_plan> out;
  for (int k = 0; k < stages_per_replica(); ++k) out.push_back({stages[k].address, stages[k].params, {}, -1});
  return out;
}

namespace {

/// The pipeline's devices and the node each is on: --device-speeds (and
/// --device-memory) describe emulated devices, placed in turn on the nodes that
/// may host stages; else the devices the cluster's nodes declare; else K
/// devices of speed 1 in turn on those nodes.
struct device_set {
  std::vector<model::device_cost> devices;
  std::vector<uint32_t> nodes;
  bool emulated = false;
};

device_set pipeline_devices(const pipeline_settings& ps, const topology& t, const std::vector<uint32_t>& hosts) {
  device_set out;
  const bool several = t.nodes.size() > 1;
  auto add = [&](model::device_cost d, uint32_t node) {
    if (several) d.name += "@" + t.nodes[node].name;
    out.devices.push_back(std::move(d));
    out.nodes.push_back(node);
  };
  bool declared = false;
  for (uint32_t n : hosts) declared = declared || !t.nodes[n].devices.empty();
  if (declared && ps.device_speeds.empty()) {
    for (uint32_t n : hosts)
      for (const model::device_cost& d : t.nodes[n].devices) add(d, n);
    return out;
  }
  out.emulated = !ps.device_speeds.empty();
  const std::size_t n = ps.device_speeds.empty() ? static_cast<std::size_t>(ps.stages) : ps.device_speeds.size();
  for (std::size_t d = 0; d < n; ++d) {
    model::device_cost c;
    c.name = "d" + std::to_string(d);
    c.speed = ps.device_speeds.empty() ? 1.0 : ps.device_speeds[d];
    c.memory_bytes = ps.device_memory_mb.empty() ? 0 : static_cast<int64_t>(ps.device_memory_mb[d] * 1048576.0);
    add(c, hosts[d % hosts.size()]);
  }
  return out;
}

/// The link between stages: --link-cost, or one process's.
model::link_cost pipeline_link(const pipeline_settings& ps) {
  if (ps.link_cost.size() == 2) return {ps.link_cost[0], ps.link_cost[1]};
  return model::same_process_link();
}

/// Cut points and devices of the stages: even (balanced multiply-adds, or
/// --pipeline-cuts; devices in order or --stage-devices) or a placer's.
model::placement place_stages(const settings& s, const model::model::layer_profile& profile,
                              const std::vector<model::layer_cost>& costs,
                              const std::vector<model::device_cost>& devices) {
  const pipeline_settings& ps = s.pipeline;
  const std::size_t layers = profile.costs.size();
  for (int c : ps.cuts)
    if (static_cast<std::size_t>(c) >= layers)
      throw error("--pipeline-cuts: layer " + std::to_string(c) + " of a model of " + std::to_string(layers) + " layers");
  model::placement given;
  if (ps.cuts.empty()) {
    const std::vector<std::size_t> bounds = model::contiguous_partition(profile.costs, ps.stages, "--pipeline-stages");
    for (int k = 1; k < ps.stages; ++k) given.cuts.push_back(static_cast<int>(bounds[k]));
  } else {
    given.cuts = ps.cuts;
  }
  given.devices = ps.stage_devices;
  for (int k = static_cast<int>(given.devices.size()); k < ps.stages; ++k) given.devices.push_back(k);
  model::placement_options o;
  o.stages = ps.stages;
  o.seed = s.seed;
  const model::link_cost link = pipeline_link(ps);
  switch (ps.placement) {
    case placement_kind::even:
    case placement_kind::manual: return model::place_manual(costs, devices, given, o);
    case placement_kind::random: return model::place_random(costs, devices, link, o);
    case placement_kind::greedy: return model::place_greedy(costs, devices, link, o);
    case placement_kind::optimal: return model::place_optimal(costs, devices, link, o);
  }
  throw error("unknown placement");
}

/// The pipeline's stages `one` for each of its replicas (one; a hybrid's
/// --workers, with a shard per stage with parameters), each replica's loader,
/// and the threads of the nodes and stages.
void add_replicas(plan& p, const settings& s, const topology& t, std::vector<stage_plan> one, int64_t train_samples) {
  const int k_stages = static_cast<int>(one.size());
  const bool hybrid = traits(s.algo.kind).on_actors;
  const int replicas = hybrid ? s.algo.workers : 1;
  p.pipeline_replicas = replicas;
  if (hybrid && traits(s.algo.kind).shards) {  // an allreduce's stages reduce with their peers instead
    const std::vector<uint32_t> shard_nodes = eligible(t, &node_spec::run_shards, "parameter shards");
    for (int k = 0; k < k_stages; ++k) {
      stage_plan& st = one[static_cast<std::size_t>(k)];
      if (st.params.numel() == 0) continue;
      st.shard = static_cast<int>(p.shards.size());
      const uint32_t node = shard_nodes[p.shards.size() % shard_nodes.size()];
      p.shards.push_back({{node, net::role::shard, static_cast<uint32_t>(st.shard)}, st.params, {}, k});
      ++p.nodes[node].shards;
    }
  }
  for (int r = 0; r < replicas; ++r) {
    for (stage_plan st : one) {
      st.replica = r;
      st.address.index = static_cast<uint32_t>(r * k_stages) + st.address.index;
      p.stages.push_back(st);
      ++p.nodes[st.address.node].stages;
      if (st.shard >= 0) p.shards[static_cast<std::size_t>(st.shard)].clients.push_back(st.address);
    }
    // Replica r's part of the data, as data-parallel worker r's (one replica: all of it).
    loader_plan l;
    l.worker = p.stages[static_cast<std::size_t>(r * k_stages)].address;
    l.address = {l.worker.node, net::role::loader, static_cast<uint32_t>(r)};
    l.begin = train_samples * r / replicas;
    l.end = train_samples * (r + 1) / replicas;
    l.seed = s.seed + 1000003ull * static_cast<uint64_t>(r);
    p.loaders.push_back(l);
    p.batches_per_epoch += batches(l.end - l.begin, s.batch_size);
  }
  int64_t updates = p.batches_per_epoch * s.epochs;
  if (traits(s.algo.kind).synchronous) updates /= replicas;  // a round is one update of every replica
  p.total_updates = std::max<int64_t>(1, updates);
  for (std::size_t n = 0; n < t.nodes.size(); ++n) {
    node_plan& np = p.nodes[n];
    np.scheduler_threads = std::max(1, std::min(t.nodes[n].threads, std::max(1, np.stages)));
    np.shard_threads = std::max(1, t.nodes[n].threads / std::max(1, np.stages));
  }
  for (auto& st : p.stages)
    st.threads = std::max(1, t.nodes[st.address.node].threads / p.nodes[st.address.node].stages);
}

/// How many emulated devices share each thread of a node, at the most over
/// the nodes (at least 1): a node of C threads hosting min(its devices, K)
/// stages gives each at most C / stages of its cores.
double emulation_share(const topology& t, const device_set& ds, int stages) {
  std::map<uint32_t, int> on_node;
  for (uint32_t n : ds.nodes) ++on_node[n];
  double share = 1;
  for (const auto& [n, devices] : on_node)
    share = std::max(share, static_cast<double>(std::min(devices, stages)) / std::max(1, t.nodes[n].threads));
  return share;
}

/// Cuts the model's layers into the pipeline's stages and places each on a
/// device (and so on the device's node); one loader feeds the first stage.
/// With an asynchronous algorithm, a hybrid: D = --workers replicas of the
/// pipeline, each on its own part of the data, every replica's stages on the
/// same devices; stage k of every replica pushes its gradients to shard k
/// (the parameters of stage k; stages without parameters have none).
void plan_pipeline(plan& p, const settings& s, const topology& t, const model::param_layout& layout,
                   int64_t train_samples, const model::model::layer_profile& profile,
                   const std::vector<model::layer_cost>* measured) {
  const pipeline_settings& ps = s.pipeline;
  const std::size_t layers = profile.costs.size();
  const int64_t micro = std::max<int64_t>(1, s.batch_size / ps.micro_batches);
  std::vector<model::layer_cost> costs =
      measured ? *measured : model::estimate_costs(profile, micro, ps.micro_batches);
  if (costs.size() != layers)
    throw error("make_plan: " + std::to_string(costs.size()) + " layer costs for a model of " + std::to_string(layers) +
                " layers");
  const std::vector<uint32_t> nodes = eligible(t, &node_spec::run_workers, "pipeline stages");
  const device_set ds = pipeline_devices(ps, t, nodes);
  if (static_cast<int>(ds.devices.size()) < ps.stages)
    throw error("--pipeline-stages " + std::to_string(ps.stages) + ": the cluster's nodes declare " +
                std::to_string(ds.devices.size()) + " devices (give one per stage, or --device-speeds)");
  p.devices = ds.devices;
  p.device_nodes = ds.nodes;
  double here = 1;  // the speed, in the devices' units, of one stage's share of this machine computing alone
  if (ds.emulated) {
    double fastest = 1;
    for (const auto& d : p.devices) fastest = std::max(fastest, d.speed);
    // Emulation slows every stage to its device's speed, so this machine must
    // be at least as fast as the fastest device for every stage at once: when
    // a node's stages outnumber its threads (4 stages on 2 cores), they
    // share the cores, and the fastest device is emulated that many times
    // slower than a stage running alone here. A cost measured here is then a
    // device of speed `here`'s: at speed 1 it takes `here` times as long.
    here = fastest * emulation_share(t, ds, ps.stages);
    for (auto& c : costs) {
      c.fwd_s *= here;
      c.bwd_s *= here;
    }
  }
  const model::placement placed = place_stages(s, profile, costs, p.devices);
  p.estimate = model::evaluate(costs, p.devices, pipeline_link(ps), placed);
  std::vector<std::size_t> bounds{0};
  for (int c : placed.cuts) bounds.push_back(static_cast<std::size_t>(c));
  bounds.push_back(layers);
  std::vector<stage_plan> one;  // a replica's stages
  uint32_t tensor = 0;
  for (int k = 0; k < ps.stages; ++k) {
    stage_plan st;
    st.device = placed.devices[k];
    st.address = {p.device_nodes[st.device], net::role::stage, static_cast<uint32_t>(k)};
    st.first_layer = bounds[k];
    st.last_layer = bounds[k + 1];
    st.slowdown = ds.emulated ? static_cast<float>(here / p.devices[st.device].speed) : 1.0f;
    if (measured && ds.emulated) {
      st.fwd_action_s = p.estimate.stages[k].fwd_s / ps.micro_batches;
      st.bwd_action_s = p.estimate.stages[k].bwd_s / ps.micro_batches;
    }
    const uint32_t first = tensor;
    for (std::size_t l = st.first_layer; l < st.last_layer; ++l) tensor += static_cast<uint32_t>(profile.tensors[l]);
    st.params = {first, tensor, first < layout.size() ? layout[first].offset : layout.numel(),
                 tensor < layout.size() ? layout[tensor].offset : layout.numel()};
    one.push_back(st);
  }
  add_replicas(p, s, t, std::move(one), train_samples);
}

} // namespace

namespace {

/// The placement as one JSON object: the devices, each stage's cost and the prediction.
std::string placement_json(const plan& p, const settings& s) {
  const model::placement_estimate& e = p.estimate;
  nlohmann::ordered_json j;
  j["placement"] = to_string(s.pipeline.placement);
  j["micro_batches"] = s.pipeline.micro_batches;
  j["batch_size"] = s.batch_size;
  j["devices"] = nlohmann::ordered_json::array();
  for (const auto& d : p.devices)
    j["devices"].push_back({{"name", d.name}, {"speed", d.speed}, {"memory_bytes", d.memory_bytes}});
  j["stages"] = nlohmann::ordered_json::array();
  for (const model::stage_estimate& st : e.stages)
    j["stages"].push_back({{"first_layer", st.first}, {"last_layer", st.last}, {"device", st.device},
                           {"fwd_s", st.fwd_s}, {"bwd_s", st.bwd_s}, {"transfer_s", st.transfer_s},
                           {"time_s", st.time_s}, {"send_bytes", st.send_bytes}, {"memory_bytes", st.memory_bytes}});
  j["bottleneck"] = e.bottleneck;
  j["predicted_step_s"] = e.step_s;
  return j.dump();
}

} // namespace

std::string describe_placement(const plan& p, const settings& s, bool json) {
  std::ostringstream out;
  const model::placement_estimate& e = p.estimate;
  if (p.stages.empty() || static_cast<int>(e.stages.size()) != p.stages_per_replica())
    throw error("describe_placement: the plan has no pipeline (give --pipeline-stages K > 1)");
  auto ms = [](double sec) { return sec * 1000.0; };
  if (json) return placement_json(p, s) + "\n";
  out.setf(std::ios::fixed);
  out.precision(2);
  out << "placement " << to_string(s.pipeline.placement) << ", " << e.stages.size() << " stages, "
      << (p.pipeline_replicas > 1 ? "each device running one stage of each of " + std::to_string(p.pipeline_replicas) +
                                        " pipeline replicas (not in the prediction), "
                                  : std::string())
      << s.pipeline.micro_batches << " micro-batches of " << s.batch_size / s.pipeline.micro_batches
      << " samples (times per mini-batch):\n";
  out << "| stage | layers | device (speed) | forward ms | backward ms | transfer ms | time ms | memory MB |\n";
  out << "|---|---|---|---|---|---|---|---|\n";
  for (std::size_t k = 0; k < e.stages.size(); ++k) {
    const model::stage_estimate& st = e.stages[k];
    out << "| " << k << (static_cast<int>(k) == e.bottleneck ? " (bottleneck)" : "") << " | [" << st.first << ", "
        << st.last << ") | " << p.devices[st.device].name << " (" << p.devices[st.device].speed << ") | "
        << ms(st.fwd_s) << " | " << ms(st.bwd_s) << " | " << ms(st.transfer_s) << " | " << ms(st.time_s) << " | "
        << static_cast<double>(st.memory_bytes) / 1048576.0 << " |\n";
  }
  out << "predicted step time " << ms(e.step_s) << " ms (stage " << e.bottleneck << " is the bottleneck)\n";
  return out.str();
}

namespace {

/// The inputs make_plan cannot plan with: a node without threads, a speed per
/// worker missing, more workers than samples.
void check_inputs(const settings& s, const topology& t, int64_t train_samples, const std::vector<float>& slowdowns) {
  if (t.nodes.empty()) throw error("the topology has no nodes");
  for (const auto& n : t.nodes)
    if (n.threads < 1) throw error("node " + n.name + ": threads must be at least 1, got " + std::to_string(n.threads));
  const int workers = s.algo.workers;
  if (!slowdowns.empty() && static_cast<int>(slowdowns.size()) != workers)
    throw error("--worker-speeds: " + std::to_string(slowdowns.size()) + " speeds for " + std::to_string(workers) +
                " workers (give one per worker)");
  if (train_samples < workers)
    throw error("--workers " + std::to_string(workers) + " exceeds the " + std::to_string(train_samples) +
                " training samples");
}

/// A hybrid (--workers replicas of the pipeline, each stage pushing to the
/// shard of its parameters) takes the settings it can run.
void check_hybrid(const settings& s, const std::vector<float>& slowdowns) {
  const algorithm_settings& a = s.algo;
  if (!traits(a.kind).on_actors) return;
  const std::string with = "--pipeline-stages with --algorithm " + std::string(to_string(a.kind)) + ": ";
  if (!traits(a.kind).shards && !traits(a.kind).collective)
    throw error(with + "a hybrid's stages push to parameter shards or allreduce with their peers; use another "
                       "algorithm, or sequential (each stage updates its own parameters)");
  if (traits(a.kind).shards && s.pipeline.schedule != model::pipeline_schedule::gpipe)
    throw error(with + "a hybrid on shards runs --schedule gpipe (one push per stage and mini-batch), not " +
                std::string(model::to_string(s.pipeline.schedule)) + " (--algorithm allreduce runs both)");
  if (a.shards != 1 || a.shard_cut != model::shard_cut::automatic)
    throw error(with + "the shards follow the stages (one per stage with parameters): leave --shards and --shard-cut out");
  if (a.push_every != 1) throw error(with + "stages push every mini-batch: leave --push-every out");
  if (!slowdowns.empty())
    throw error(with + "--worker-speeds sets data-parallel workers' speeds; set a stage's device speed with "
                       "--device-speeds");
}

/// Workers (each with its loader on its node) round-robin over the nodes
/// that may host them; a node's threads split over its workers (scheduler
/// threads beyond the workers only steal cores from their kernels).
void plan_workers(plan& p, const settings& s, const topology& t, int64_t train_samples,
                  const std::vector<float>& slowdowns) {
  const int workers = s.algo.workers;
  const std::vector<uint32_t> worker_nodes = eligible(t, &node_spec::run_workers, "workers");
  for (int i = 0; i < workers; ++i) {
    const uint32_t node = worker_nodes[static_cast<std::size_t>(i) % worker_nodes.size()];
    const uint32_t index = static_cast<uint32_t>(i);
    loader_plan l;
    l.address = {node, net::role::loader, index};
    l.worker = {node, net::role::worker, index};
    l.begin = train_samples * i / workers;
    l.end = train_samples * (i + 1) / workers;
    l.seed = s.seed + 1000003ull * static_cast<uint64_t>(i);
    p.loaders.push_back(l);
    p.workers.push_back({l.worker, l.address, 1, slowdowns.empty() ? 1.0f : slowdowns[static_cast<std::size_t>(i)]});
    ++p.nodes[node].workers;
    p.batches_per_epoch += batches(l.end - l.begin, s.batch_size);
  }
  for (std::size_t n = 0; n < t.nodes.size(); ++n) {
    node_plan& np = p.nodes[n];
    np.scheduler_threads = std::max(1, std::min(t.nodes[n].threads, std::max(1, np.workers)));
    np.shard_threads = np.workers > 0 ? std::max(1, t.nodes[n].threads / np.workers) : t.nodes[n].threads;
  }
  for (auto& w : p.workers)
    w.threads = std::max(1, t.nodes[w.address.node].threads / p.nodes[w.address.node].workers);
}

/// The parameter shards round-robin over the nodes that may host them, or
/// one buffer shared in one process (Hogwild!).
void plan_data_shards(plan& p, const settings& s, const topology& t, const model::param_layout& layout) {
  const algorithm_settings& a = s.algo;
  if (traits(a.kind).shards) {
    const std::vector<uint32_t> shard_nodes = eligible(t, &node_spec::run_shards, "parameter shards");
    p.shard_cut = model::choose_shard_cut(layout, a.shards, a.shard_cut, t.nodes.size() > 1);
    const std::vector<model::shard_range> ranges = model::plan_shards(layout, a.shards, p.shard_cut.cut);
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      const uint32_t node = shard_nodes[i % shard_nodes.size()];
      p.shards.push_back({{node, net::role::shard, static_cast<uint32_t>(i)}, ranges[i], {}, -1});
      for (const worker_plan& w : p.workers) p.shards.back().clients.push_back(w.address);
      ++p.nodes[node].shards;
    }
  } else if (traits(a.kind).collective) {
    // Every replica holds the same values after each step: the first worker's answers a snapshot.
    const model::shard_range all{0, static_cast<uint32_t>(layout.size()), 0, layout.numel()};
    p.worker_holders.push_back({p.workers.front().address, all, {}, -1});
  } else if (t.nodes.size() != 1) {
    throw error(std::string("--algorithm ") + to_string(a.kind) +
                " shares one buffer in one process: it runs on one node, the topology has " +
                std::to_string(t.nodes.size()));
  }
}

} // namespace

plan make_plan(const settings& s, const topology& t, const model::param_layout& layout, int64_t train_samples,
               const model::model::layer_profile* profile, const std::vector<model::layer_cost>* costs) {
  const std::vector<float> slowdowns = worker_slowdowns(s.algo);
  check_inputs(s, t, train_samples, slowdowns);
  plan p;
  p.coordinator = {0, net::role::coordinator, 0};
  p.evaluator = {0, net::role::evaluator, 0};
  p.nodes.resize(t.nodes.size());
  p.samples_per_epoch = train_samples;
  p.costs_measured = costs != nullptr;
  // In one process nothing is lost on the way; a cluster's worker pulls again
  // what a push did not answer within the peer timeout (not SSGD: its rounds wait for every worker).
  p.pull_retry_s = t.nodes.size() > 1 && traits(s.algo.kind).retries_pulls() ? t.peer_timeout_s : 0;
  if (s.pipeline.stages > 1) {
    check_hybrid(s, slowdowns);
    if (!profile) throw error("make_plan: a pipeline needs the model's layer profile");
    plan_pipeline(p, s, t, layout, train_samples, *profile, costs);
    return p;
  }
  plan_workers(p, s, t, train_samples, slowdowns);
  plan_data_shards(p, s, t, layout);
  p.shared_buffer = traits(s.algo.kind).shared_memory;
  int64_t updates = p.batches_per_epoch * s.epochs / s.algo.push_every;
  if (traits(s.algo.kind).synchronous) updates /= s.algo.workers;  // a round is one update of every worker
  p.total_updates = std::max<int64_t>(1, updates);
  return p;
}

} // namespace troupe::train
