#include "train/plan.hpp"

#include <algorithm>
#include <sstream>
#include <thread>

#include "tensor/error.hpp"

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
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  topology t;
  t.nodes.push_back({"local", threads, true, true});
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
       << s.range.numel() << " parameters\n";
  return os.str();
}

std::vector<shard_plan> plan::parameter_holders() const {
  if (stages.empty()) return shards;
  std::vector<shard_plan> out;  // every stage, those without parameters too: index k is stage k
  for (const auto& st : stages) out.push_back({st.address, st.params});
  return out;
}

namespace {

/// Cuts the model's layers into the pipeline's stages, placed round-robin on
/// the nodes that may host workers; one loader feeds the first stage.
void plan_pipeline(plan& p, const settings& s, const topology& t, const model::param_layout& layout,
                   int64_t train_samples, const model::model::layer_profile& profile) {
  const pipeline_settings& ps = s.pipeline;
  const std::size_t layers = profile.costs.size();
  std::vector<std::size_t> bounds;
  if (ps.cuts.empty()) {
    bounds = model::contiguous_partition(profile.costs, ps.stages, "--pipeline-stages");
  } else {
    bounds.push_back(0);
    for (int c : ps.cuts) {
      if (static_cast<std::size_t>(c) >= layers)
        throw error("--pipeline-cuts: layer " + std::to_string(c) + " of a model of " + std::to_string(layers) + " layers");
      bounds.push_back(static_cast<std::size_t>(c));
    }
    bounds.push_back(layers);
  }
  const std::vector<uint32_t> nodes = eligible(t, &node_spec::run_workers, "pipeline stages");
  uint32_t tensor = 0;
  for (int k = 0; k < ps.stages; ++k) {
    stage_plan st;
    const uint32_t node = nodes[static_cast<std::size_t>(k) % nodes.size()];
    st.address = {node, net::role::stage, static_cast<uint32_t>(k)};
    st.first_layer = bounds[k];
    st.last_layer = bounds[k + 1];
    const uint32_t first = tensor;
    for (std::size_t l = st.first_layer; l < st.last_layer; ++l) tensor += static_cast<uint32_t>(profile.tensors[l]);
    st.params = {first, tensor, first < layout.size() ? layout[first].offset : layout.numel(),
                 tensor < layout.size() ? layout[tensor].offset : layout.numel()};
    p.stages.push_back(st);
    ++p.nodes[node].stages;
  }
  loader_plan l;
  l.address = {p.stages[0].address.node, net::role::loader, 0};
  l.worker = p.stages[0].address;
  l.begin = 0;
  l.end = train_samples;
  l.seed = s.seed;
  p.loaders.push_back(l);
  p.batches_per_epoch = batches(train_samples, s.batch_size);
  p.total_updates = std::max<int64_t>(1, p.batches_per_epoch * s.epochs);
  for (std::size_t n = 0; n < t.nodes.size(); ++n) {
    node_plan& np = p.nodes[n];
    np.scheduler_threads = std::max(1, std::min(t.nodes[n].threads, std::max(1, np.stages)));
  }
  for (auto& st : p.stages)
    st.threads = std::max(1, t.nodes[st.address.node].threads / p.nodes[st.address.node].stages);
}

} // namespace

plan make_plan(const settings& s, const topology& t, const model::param_layout& layout, int64_t train_samples,
               const model::model::layer_profile* profile) {
  if (t.nodes.empty()) throw error("the topology has no nodes");
  for (const auto& n : t.nodes)
    if (n.threads < 1) throw error("node " + n.name + ": threads must be at least 1, got " + std::to_string(n.threads));
  const algorithm_settings& a = s.algo;
  const int workers = a.workers;
  if (!a.speeds.empty() && static_cast<int>(a.speeds.size()) != workers)
    throw error("--speeds: " + std::to_string(a.speeds.size()) + " factors for " + std::to_string(workers) + " workers");
  if (train_samples < workers)
    throw error("--workers " + std::to_string(workers) + " exceeds the " + std::to_string(train_samples) +
                " training samples");
  plan p;
  p.coordinator = {0, net::role::coordinator, 0};
  p.evaluator = {0, net::role::evaluator, 0};
  p.nodes.resize(t.nodes.size());
  p.samples_per_epoch = train_samples;
  if (s.pipeline.stages > 1) {
    if (a.kind != algorithm_kind::sequential)
      throw error("--pipeline-stages with --algorithm " + std::string(to_string(a.kind)) +
                  ": stages pushing to parameter shards (a hybrid of data and model parallelism) are not built "
                  "yet; use --algorithm sequential (each stage updates its own parameters)");
    if (!profile) throw error("make_plan: a pipeline needs the model's layer profile");
    plan_pipeline(p, s, t, layout, train_samples, *profile);
    return p;
  }

  // Workers (each with its loader on its node) round-robin over the nodes that may host them.
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
    p.workers.push_back({l.worker, l.address, 1, a.speeds.empty() ? 1.0f : a.speeds[i]});
    ++p.nodes[node].workers;
    p.batches_per_epoch += batches(l.end - l.begin, s.batch_size);
  }
  // Kernel threads: a node's threads split over its workers. Scheduler
  // threads beyond the workers only steal cores from their kernels.
  for (std::size_t n = 0; n < t.nodes.size(); ++n) {
    node_plan& np = p.nodes[n];
    np.scheduler_threads = std::max(1, std::min(t.nodes[n].threads, std::max(1, np.workers)));
    np.shard_threads = np.workers > 0 ? std::max(1, t.nodes[n].threads / np.workers) : t.nodes[n].threads;
  }
  for (auto& w : p.workers)
    w.threads = std::max(1, t.nodes[w.address.node].threads / p.nodes[w.address.node].workers);

  if (a.kind != algorithm_kind::hogwild) {
    const std::vector<uint32_t> shard_nodes = eligible(t, &node_spec::run_shards, "parameter shards");
    const std::vector<model::shard_range> ranges = model::plan_shards(layout, a.shards);
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      const uint32_t node = shard_nodes[i % shard_nodes.size()];
      p.shards.push_back({{node, net::role::shard, static_cast<uint32_t>(i)}, ranges[i]});
      ++p.nodes[node].shards;
    }
  } else if (t.nodes.size() != 1) {
    throw error("--algorithm hogwild shares one buffer in one process: it runs on one node, the topology has " +
                std::to_string(t.nodes.size()));
  }
  int64_t updates = p.batches_per_epoch * s.epochs / a.push_every;
  if (a.kind == algorithm_kind::ssgd) updates /= workers;
  p.total_updates = std::max<int64_t>(1, updates);
  return p;
}

} // namespace troupe::train
