// troupe::fit: the sequential loop, or one node's actors from the plan.

#include <caf/all.hpp>

#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <ostream>
#include <sstream>

#include "actors/fit.hpp"
#include "actors/messages.hpp"
#include "actors/node_actor.hpp"
#include "actors/roles.hpp"
#include "model/cost_profile.hpp"
#include "net/checkpoint.hpp"
#include "net/transport.hpp"
#include "train/profile_cache.hpp"
#include "train/cluster.hpp"
#include "train/job_file.hpp"
#include "train/loop.hpp"
#include "train/trace.hpp"

namespace troupe::actors {

namespace {

/// What a run on actors starts from: the data, the model it evaluates on
/// (its parameters the starting point), and where a resumed run goes on.
struct starting_point {
  std::shared_ptr<const train::loaded_data> data;
  model::model net;
  int first_epoch = 0;
  int64_t first_steps = 0;
  int64_t epoch_samples = 0;  ///< of epoch first_epoch + 1, trained before the checkpoint
  bool resuming = false;
  net::checkpoint checkpoint;
};

starting_point load(const job& j, std::ostream& log) {
  starting_point p;
  p.data = std::make_shared<const train::loaded_data>(train::load_data(j, log));
  p.net = j.build_model(p.data->sets.train.sample_shape());
  p.resuming = train::resumes(j.config());
  if (p.resuming) {
    p.checkpoint = net::load_checkpoint(j.config().checkpoint);
    p.net.load_state(p.checkpoint.architecture, p.checkpoint.params);
    p.first_epoch = static_cast<int>(p.checkpoint.epoch);
    p.first_steps = static_cast<int64_t>(p.checkpoint.step);
    p.epoch_samples = train::log_resume(j.config().checkpoint, p.first_epoch, p.first_steps,
                                        static_cast<int64_t>(p.checkpoint.epoch_samples), p.data->sets.train.count, log);
  }
  return p;
}

std::shared_ptr<hogwild_store> make_hogwild(model::model& net) {
  const model::model::flat_buffers flat = net.flatten();
  return std::make_shared<hogwild_store>(flat.values.data(), flat.values.numel());
}

std::unique_ptr<weight_source> make_source(const job& j, const train::plan& p, const train::worker_plan& w,
                                           const model::param_layout& layout,
                                           const std::shared_ptr<hogwild_store>& hogwild) {
  const settings& s = j.config();
  if (hogwild) return hogwild_weights(hogwild, s.lr, s.schedule, p.total_updates);
  shard_source_config c{w.address, p.shards, layout, w.threads};
  if (s.algo.push_every > 1)
    return local_steps(c, s.algo.push_every, s.algo.worker_lr > 0 ? s.algo.worker_lr : s.lr, s.algo.worker_momentum);
  return shard_weights(c);
}

/// Faults to inject on this node's outgoing frames, for tests: off unless
/// TROUPE_FAULT_DROP, TROUPE_FAULT_DELAY, TROUPE_FAULT_DUPLICATE (probabilities)
/// or TROUPE_FAULT_DISCONNECT are set; TROUPE_FAULT_SEED seeds them.
net::fault_options faults_from(const std::map<std::string, std::string>& env) {
  net::fault_options f;
  auto number = [&](const char* key, double& into) {
    auto it = env.find(key);
    if (it == env.end()) return;
    char* end = nullptr;
    const double v = std::strtod(it->second.c_str(), &end);
    if (*end || !(v >= 0 && v <= 1)) throw error(std::string(key) + " must be a probability in [0, 1], got '" + it->second + "'");
    into = v;
  };
  number("TROUPE_FAULT_DROP", f.drop);
  number("TROUPE_FAULT_DELAY", f.delay);
  number("TROUPE_FAULT_DUPLICATE", f.duplicate);
  number("TROUPE_FAULT_DISCONNECT", f.disconnect);
  if (auto it = env.find("TROUPE_FAULT_SEED"); it != env.end()) f.seed = std::strtoull(it->second.c_str(), nullptr, 10);
  return f;
}

/// One node of a run: its part of the plan, spawned on `sys` and registered in `dir`.
struct node_run {
  const job& j;
  const train::plan& p;
  uint32_t self = 0;
  starting_point& start;
  std::shared_ptr<hogwild_store> hogwild;
  std::shared_ptr<directory> dir;
  std::shared_ptr<outcome> result;
  std::vector<std::string> node_names;
  double join_timeout_s = 60;
  train::run_info info;
  std::ostream& log;
  /// After how long a worker pulls again the shards that did not answer a push (0: never, one process).
  std::chrono::milliseconds reply_timeout{0};
  std::shared_ptr<train::tracer> trace;  ///< the run's timeline (--trace), or null
  std::shared_ptr<net::rejection_log> rejections;  ///< a cluster: what the transport refused
};

/// Continues stage `index` of `stages` from checkpoint `c`: its momentum
/// ("shard<index>/velocity", as the evaluator names a holder's state); a
/// checkpoint of another layout or without it leaves the momentum at 0 and says so.
void resume_stage(stage_core& stage, const net::checkpoint& c, std::size_t index, std::size_t stages,
                  std::ostream& log) {
  const std::string name = "shard" + std::to_string(index) + "/velocity";
  const std::string fresh = net::to_string(stage.address()) + ": momentum starts at 0: ";
  if (c.shard_versions.size() != stages) {
    log << fresh << "the checkpoint has " << c.shard_versions.size() << " parameter holder(s), this run " << stages
        << " stages\n";
    return;
  }
  for (const named_tensor& t : c.optimizer)
    if (t.name == name) {
      try {
        stage.restore({{"velocity", t.value}});
      } catch (const error& e) {
        log << fresh << e.what() << "\n";
      }
      return;
    }
  if (stage.config().momentum != 0.0f) log << fresh << "the checkpoint holds none for it\n";
}

/// The pipeline stages (and the loader of the first) the plan puts on node `r.self`.
void spawn_stages(caf::actor_system& sys, node_run& r, const std::shared_ptr<const job>& shared_job,
                  std::vector<caf::actor>& locals) {
  const settings& s = r.j.config();
  const model::param_layout layout = r.start.net.layout();
  const model::model::flat_buffers flat = r.start.net.flatten();
  const shape sample = r.start.data->sets.train.sample_shape();
  const int k_stages = r.p.stages_per_replica();
  // Mini-batches of the run. A hybrid's replicas go on until the coordinator
  // has counted the run's samples (an epoch ends on every replica's samples
  // together, as data-parallel workers'): each may take up to all of them.
  int64_t steps = r.p.total_updates * (traits(s.algo.kind).synchronous ? r.p.pipeline_replicas : 1) -
                  r.start.first_steps;
  if (s.max_steps > 0) steps = std::min(steps, s.max_steps - r.start.first_steps);
  // A resumed run takes at least one step, as workers and the sequential loop do
  // (the coordinator ends the run on the first report past --max-steps).
  steps = std::max<int64_t>(1, steps);
  for (std::size_t i = 0; i < r.p.stages.size(); ++i) {
    const train::stage_plan& sp = r.p.stages[i];
    if (sp.address.node != r.self) continue;
    const int k = static_cast<int>(i) % k_stages;
    const train::loader_plan& lp = r.p.loaders[static_cast<std::size_t>(sp.replica)];
    stage_config c;
    c.plan = sp;
    c.index = k;
    c.stages = k_stages;
    c.previous = k > 0 ? r.p.stages[i - 1].address : sp.address;
    c.next = k + 1 < k_stages ? r.p.stages[i + 1].address : sp.address;
    c.coordinator = r.p.coordinator;
    if (sp.shard >= 0) c.shard = r.p.shards[static_cast<std::size_t>(sp.shard)].address;
    c.layout = layout;
    c.schedule = s.pipeline.schedule;
    c.micro_batches = s.pipeline.micro_batches;
    c.total_micro_batches = steps * s.pipeline.micro_batches;
    c.lr = s.lr;
    c.momentum = s.momentum;
    c.weight_decay = s.weight_decay;
    c.lr_schedule = s.schedule;
    c.total_steps = r.p.total_updates;
    c.steps_before = r.start.first_steps;
    c.stash = s.pipeline.stash;
    c.trace = r.trace;
    // A stage's replicas: the whole model built (same seed), its layers cut out.
    auto replicas = std::make_shared<replica_pool>([shared_job, sample, first = sp.first_layer, last = sp.last_layer] {
      return shared_job->build_model(sample).slice(first, last);
    });
    std::vector<float> initial(flat.values.data() + sp.params.begin, flat.values.data() + sp.params.end);
    auto core = std::make_shared<stage_core>(std::move(c), replicas, std::move(initial));
    if (r.start.resuming && sp.shard < 0) resume_stage(*core, r.start.checkpoint, i, r.p.stages.size(), r.log);
    locals.push_back(spawn_stage(sys, core, lp.address, r.p.coordinator, s.algo.prefetch, r.dir));
    r.dir->add(sp.address, locals.back());
    if (k == 0) {
      auto loader = std::make_shared<loader_core>(r.start.data->sets.train, r.start.data->norm, s.batch_size, lp,
                                                  r.start.first_epoch);
      loader->skip_trained(r.start.epoch_samples, r.p.samples_per_epoch);
      loader->trace(r.trace);
      locals.push_back(spawn_loader(sys, loader, r.dir));
      r.dir->add(lp.address, locals.back());
    }
  }
}

/// Spawns the actors the plan puts on node `r.self` (the coordinator and the
/// evaluator on node 0), then the node's own actor, which joins the run.
/// Returns the coordinator (node 0) or the node's actor (other nodes): the run
/// ends on this node when that actor does.
caf::actor spawn_node(caf::actor_system& sys, node_run& r) {
  const settings& s = r.j.config();
  const model::param_layout layout = r.start.net.layout();
  auto shared_job = std::make_shared<const job>(r.j);
  std::vector<caf::actor> locals;
  if (!r.hogwild) {
    const auto params = r.start.net.parameters();
    for (const auto& sp : r.p.shards) {
      if (sp.address.node != r.self) continue;
      const kernels::context ctx = kernels::context::with_threads(r.p.nodes[r.self].shard_threads);
      std::vector<named_tensor> mine;
      for (uint32_t i = sp.range.first; i < sp.range.last; ++i)
        mine.push_back({params[i]->name, params[i]->value.clone()});
      auto core = std::make_shared<shard_core>(sp, mine, rule_config(s), s.schedule, r.p.total_updates, ctx);
      if (r.start.resuming)
        resume_shard(*core, r.start.checkpoint, to_string(s.algo.kind), static_cast<int>(r.p.shards.size()), r.log);
      core->trace(r.trace);
      locals.push_back(spawn_shard(sys, core, r.dir, &r.log));
      r.dir->add(sp.address, locals.back());
    }
  }
  const shape sample = r.start.data->sets.train.sample_shape();
  if (!r.p.stages.empty()) spawn_stages(sys, r, shared_job, locals);
  // Workers borrow replicas for their steps: as many exist as steps run at once.
  auto replicas = std::make_shared<replica_pool>([shared_job, sample] { return shared_job->build_model(sample); });
  for (std::size_t i = 0; i < r.p.workers.size(); ++i) {
    const train::worker_plan& w = r.p.workers[i];
    if (w.address.node != r.self) continue;
    auto loader = std::make_shared<loader_core>(r.start.data->sets.train, r.start.data->norm, s.batch_size,
                                                r.p.loaders[i], r.start.first_epoch);
    loader->skip_trained(r.start.epoch_samples, r.p.samples_per_epoch);
    loader->trace(r.trace);
    locals.push_back(spawn_loader(sys, loader, r.dir));
    r.dir->add(r.p.loaders[i].address, locals.back());
    auto core = std::make_shared<worker_core>(w, replicas, make_source(r.j, r.p, w, layout, r.hogwild));
    // Pipelined execution; a slowed worker (--speeds) holds its pushes back, so it pushes after backward.
    if (s.algo.overlap && w.speed <= 1.0f)
      core->overlap([dir = r.dir](outgoing&& o) { send_to(*dir, o.to, std::move(o.msg), o.priority); },
                    s.algo.overlap_receive);
    if (r.trace) core->trace(r.trace, net::to_string(w.address));
    // SSGD's rounds wait for every worker: a pull during one would not end it, so no retry.
    const auto retry = traits(s.algo.kind).retries_pulls() ? r.reply_timeout : std::chrono::milliseconds(0);
    locals.push_back(spawn_worker(sys, core, r.p.loaders[i].address, r.p.coordinator, s.algo.prefetch, retry, r.dir));
    r.dir->add(w.address, locals.back());
  }
  caf::actor coordinator;
  if (r.self == r.p.coordinator.node) {
    // The evaluator's model: the starting parameters, overwritten by each snapshot.
    evaluator_core::config ec{r.p.evaluator, r.p.parameter_holders(), r.hogwild, r.start.data, s.batch_size, s.checkpoint,
                              to_string(s.algo.kind)};
    auto evaluator = std::make_shared<evaluator_core>(std::move(ec), std::move(r.start.net));
    r.dir->add(r.p.evaluator, spawn_evaluator(sys, evaluator, r.p.coordinator, r.dir));
    coordinator_setup cs{shared_job, r.p,          r.info,          r.start.first_epoch, r.start.first_steps,
                         r.start.resuming, r.node_names, r.join_timeout_s, &r.log,      r.result, r.rejections,
                         r.start.epoch_samples};
    coordinator = spawn_coordinator(sys, std::move(cs), r.dir);
    r.dir->add(r.p.coordinator, coordinator);
  }
  node_setup ns{r.self, r.node_names, r.p.coordinator, r.join_timeout_s,
                coordinator ? std::vector<caf::actor>{} : locals, r.result, &r.log};
  caf::actor node = spawn_node_actor(sys, std::move(ns), r.dir);
  r.dir->add({r.self, net::role::node, 0}, node);
  caf::anon_send(node, node_start_atom::value);
  return coordinator ? coordinator : node;
}

void configure(caf::actor_system_config& cfg, const train::plan& p, uint32_t self) {
  cfg.set("scheduler.max-threads", static_cast<size_t>(p.nodes[self].scheduler_threads));
  cfg.set("logger.verbosity", caf::atom("quiet"));
  // Several workers need one shared FIFO run queue: work stealing resumes the
  // actor woken last first, which starved workers completely (0 samples for one
  // of 16 CNN workers). A single worker keeps work stealing: twice the throughput.
  // Pipeline stages share it too: with work stealing, an activation sent by a
  // busy stage sat in that stage's thread's queue until an idle thread stole
  // it, milliseconds later (a 4-stage bubble of 20-22 % instead of 16 %).
  if (p.nodes[self].workers > 1 || p.nodes[self].stages > 1) cfg.set("scheduler.policy", caf::atom("sharing"));
}

/// Waits until `last` (the coordinator, or the node's actor) has stopped,
/// then stops every local actor; the actor system waits for them when it goes.
void wait_for(caf::actor_system& sys, const caf::actor& last, const directory& dir) {
  caf::scoped_actor self{sys};
  self->monitor(last);
  self->receive([](const caf::down_msg&) {});
  for (const auto& [a, h] : dir.locals()) caf::anon_send_exit(h, caf::exit_reason::user_shutdown);
}

/// Whether the job places its stages on devices (a placer or device speeds), not only cuts them.
bool places_stages(const settings& s) {
  return s.pipeline.stages > 1 && (s.pipeline.placement != placement_kind::even || !s.pipeline.device_speeds.empty());
}

/// A placer's input in one process: every layer's forward and backward time,
/// measured on a model of its own (not the one that trains: a measurement
/// would move batch norm's running statistics) with a stage's threads. None
/// where the stages are not placed: the plan then cuts by multiply-adds. A
/// --profile-cache file that cannot be used is measured again, said on `log`.
std::optional<std::vector<model::layer_cost>> measure_for_placement(const job& j, const starting_point& start,
                                                                   const train::topology& topo, std::ostream& log) {
  const settings& s = j.config();
  if (!places_stages(s)) return std::nullopt;
  model::model m = j.build_model(start.data->sets.train.sample_shape());
  const int threads = std::max(1, topo.nodes[0].threads / s.pipeline.stages);
  const int updates = s.pipeline.schedule == pipeline_schedule::one_f_one_b ? s.pipeline.micro_batches : 1;
  const int64_t micro = std::max<int64_t>(1, s.batch_size / s.pipeline.micro_batches);
  const std::string key = m.architecture() + "|" + std::to_string(micro) + "x" +
                          std::to_string(s.pipeline.micro_batches) + "|" + std::to_string(threads) + "|" +
                          std::to_string(updates);
  auto measure = [&] {
    // Across processes: the file given by --profile-cache, when it holds this key.
    const std::string& path = s.pipeline.profile_cache;
    const std::string file_key = train::profile_key(key, "measured: 5 repetitions");
    std::string why;
    std::optional<std::vector<model::layer_cost>> costs =
        path.empty() ? std::nullopt : train::read_profile(path, file_key, m.size(), &why);
    if (!why.empty()) log << "warning: " << why << "; measuring again" << std::endl;
    if (!costs) {
      costs = model::measure_costs(m, micro, s.pipeline.micro_batches, kernels::context::with_threads(threads), 5,
                                   updates);
      if (!path.empty()) train::write_profile(path, file_key, *costs);
    }
    return std::move(*costs);
  };
  // Within the process: the caller's cache, when the job has one.
  return j.costs() ? j.costs()->get(key, measure) : measure();
}

/// The plan of `j` on `topo`. `measure`: the layers' times for a placer are
/// measured here (one process); a cluster's nodes leave it false and place by
/// estimated costs, the same on every node. Warnings go to `log`.
train::plan plan_of(const job& j, starting_point& start, const train::topology& topo,
                    const model::param_layout& layout, bool measure, std::ostream& log) {
  const model::model::layer_profile profile = start.net.profile();
  const auto costs = measure ? measure_for_placement(j, start, topo, log) : std::nullopt;
  return train::make_plan(j.config(), topo, layout, start.data->sets.train.count, &profile, costs ? &*costs : nullptr);
}

void log_plan(const job& j, const train::plan& p, const model::param_layout& layout, std::ostream& log) {
  const settings& s = j.config();
  if (!p.stages.empty()) {
    log << "model " << j.model_name() << ": " << layout.numel() << " parameters; ";
    if (p.pipeline_replicas > 1 || !p.shards.empty())
      log << p.pipeline_replicas << " replica(s) of a pipeline (" << to_string(s.algo.kind) << " on " << p.shards.size()
          << " shard(s), one per stage with parameters) of ";
    else
      log << "a pipeline of ";
    log << p.stages_per_replica() << " stages (" << model::to_string(s.pipeline.schedule) << ", "
        << s.pipeline.micro_batches << " micro-batches per mini-batch):";
    for (const auto& st : p.stages)
      log << " stage " << st.address.index << " on node " << st.address.node << ": layers [" << st.first_layer << ", "
          << st.last_layer << ") " << st.params.numel() << " parameters;";
    log << "\n";
    if (places_stages(s)) log << train::describe_placement(p, s, false);
    return;
  }
  log << "model " << j.model_name() << ": " << layout.numel() << " parameters; " << to_string(s.algo.kind) << " with "
      << p.workers.size() << " worker(s), "
      << (p.shards.empty() ? std::string("one shared buffer") : std::to_string(p.shards.size()) + " shard(s)")
      << ", push every " << s.algo.push_every << ", " << p.workers.front().threads << " thread(s) per worker\n";
}

history run_on_actors(const job& j, std::ostream& log) {
  const settings& s = j.config();
  const train::topology topo = train::topology::local(s.threads);
  starting_point start = load(j, log);
  if (start.first_epoch >= s.epochs) return {};
  const model::param_layout layout = start.net.layout();
  const train::plan p = plan_of(j, start, topo, layout, true, log);
  auto hw = traits(s.algo.kind).shared_memory ? make_hogwild(start.net) : nullptr;
  log_plan(j, p, layout, log);
  auto result = std::make_shared<outcome>();
  auto trace = s.trace.empty() ? nullptr : std::make_shared<train::tracer>(s.trace, 0);
  {
    caf::actor_system_config cfg;
    configure(cfg, p, 0);
    caf::actor_system sys{cfg};
    auto dir = std::make_shared<directory>();
    node_run r{j, p, 0, start, hw, dir, result, {"local"}, 60, train::info_of(j, topo.nodes[0].threads), log, std::chrono::milliseconds{0}, trace, nullptr};
    const caf::actor last = spawn_node(sys, r);
    wait_for(sys, last, *dir);
  }  // the actor system waits for every actor here
  if (trace) trace->write();
  if (!result->error.empty()) throw_failure(result->kind, result->error);
  return result->epochs;
}

/// What every node of a cluster must agree on: nodes of another job refuse each other.
std::string job_identity(const job& j, const train::cluster_spec& c, const starting_point& start) {
  train::job_spec spec{j.model_name(), j.data_source().description(), j.config(), c};
  return "troupe schema " + std::to_string(wire::SCHEMA_VERSION) + "\n" + train::to_job_file(spec) +
         "architecture " + start.net.architecture() + "\nsamples " + std::to_string(start.data->sets.train.count) +
         " / " + std::to_string(start.data->sets.test.count) + "\n";
}

/// The links of node `self` of cluster `c`.
net::transport_options link_options(const train::cluster_spec& c, uint32_t self, const std::string& secret,
                                    const std::string& job_hash) {
  net::transport_options to;
  to.self = self;
  for (const auto& n : c.nodes) to.nodes.push_back({n.name, n.host, n.port});
  to.secret = secret;
  to.job_hash = job_hash;
  to.heartbeat = std::chrono::milliseconds(static_cast<int64_t>(c.heartbeat_s * 1000));
  to.peer_timeout = std::chrono::milliseconds(static_cast<int64_t>(c.peer_timeout_s * 1000));
  to.encrypt = c.encrypt;
  to.faults = faults_from(train::environment());
  return to;
}

/// Where the transport's events go: messages to the local actor they name,
/// peers up, down and refused to the node's actor (`*node_actor`, set once it
/// exists), rejections to the log through `rejections`.
net::transport_handlers link_handlers(std::shared_ptr<directory> dir, std::shared_ptr<caf::actor> node_actor,
                                      std::shared_ptr<net::rejection_log> rejections,
                                      std::vector<net::endpoint> nodes, std::ostream& log) {
  net::transport_handlers h;
  h.on_message = [dir](uint32_t, const net::address& to, net::message m) {
    if (const caf::actor* a = dir->local(to)) caf::anon_send(*a, std::move(m));
  };
  h.on_peer_up = [node_actor](uint32_t node) { caf::anon_send(*node_actor, peer_up_atom::value, node); };
  h.on_peer_down = [node_actor](uint32_t node, const std::string& why, bool goodbye) {
    caf::anon_send(*node_actor, peer_down_atom::value, node, why, goodbye);
  };
  h.on_rejected = [&log, rejections, node_actor, nodes = std::move(nodes)](const net::rejection& x) {
    for (const std::string& line : rejections->add(x, net::rejection_log::clock::now())) log << line << std::endl;
    // A refused handshake, with the node dialed or claimed (unauthenticated), or its remote address
    // where it named none: the join timeout says it.
    if (x.authenticated) return;
    if (x.node >= 0 && static_cast<std::size_t>(x.node) < nodes.size())
      caf::anon_send(*node_actor, peer_refused_atom::value, static_cast<uint32_t>(x.node),
                     nodes[x.node].host + ":" + std::to_string(nodes[x.node].port), x.reason, x.what);
    else
      caf::anon_send(*node_actor, peer_refused_atom::value, no_node, x.remote, x.reason, x.what);
  };
  return h;
}

/// This process as node `self` of cluster `c`: its actors, its links to the
/// other nodes, and the run until its end. Node 0 returns the records.
history run_cluster(const job& j, const train::cluster_spec& c, uint32_t self, std::ostream& log) {
  const settings& s = j.config();
  const train::node_entry& me = c.nodes.at(self);
  log << "node " << me.name << " (" << self + 1 << " of " << c.nodes.size() << "), listening on " << me.host << ":"
      << me.port << "\n";
  const std::string secret = net::read_secret_file(c.secret_file);  // before minutes of loading
  starting_point start = load(j, log);
  if (start.first_epoch >= s.epochs) return {};
  const model::param_layout layout = start.net.layout();
  const train::topology topo = train::topology_of(c, self, s.threads);
  const train::plan p = plan_of(j, start, topo, layout, false, log);
  if (self == p.coordinator.node) log_plan(j, p, layout, log);
  std::vector<std::string> names;
  for (const auto& n : c.nodes) names.push_back(n.name);
  const net::transport_options to = link_options(c, self, secret, job_identity(j, c, start));

  auto result = std::make_shared<outcome>();
  {
    caf::actor_system_config cfg;
    configure(cfg, p, self);
    caf::actor_system sys{cfg};
    auto dir = std::make_shared<directory>();
    node_run r{j, p, self, start, nullptr, dir, result, names, c.join_timeout_s,
               train::info_of(j, topo.nodes[self].threads), log, to.peer_timeout, nullptr, nullptr};
    // Each node writes its own timeline: node 0 to --trace, node n to --trace with ".node<n>" added.
    if (!s.trace.empty())
      r.trace = std::make_shared<train::tracer>(self == 0 ? s.trace : s.trace + ".node" + std::to_string(self), self);
    // The transport's events go to the node's actor, which exists once spawn_node returns.
    auto node_actor = std::make_shared<caf::actor>();
    r.rejections = std::make_shared<net::rejection_log>();
    net::transport link(to, link_handlers(dir, node_actor, r.rejections, to.nodes, log));
    for (uint32_t n = 0; n < c.nodes.size(); ++n)
      if (n != self) dir->add_remote(n, [&link, n](const net::address& a, const net::message& m, int priority) {
          link.send(n, a, m, priority);
        });
    const caf::actor last = spawn_node(sys, r);
    *node_actor = caf::actor_cast<caf::actor>(*dir->local({self, net::role::node, 0}));
    link.start();
    wait_for(sys, last, *dir);
    link.stop();
    for (const std::string& line : r.rejections->flush()) log << line << "\n";
    if (r.trace) r.trace->write();
  }
  if (!result->error.empty()) throw_failure(result->kind, result->error);
  return result->epochs;
}

} // namespace

std::string describe_plan(const job& j, bool json) {
  j.validate();
  const settings& s = j.config();
  const auto env = train::environment();
  const train::cluster_spec c = train::resolve(j.cluster_config(), env);
  std::ostringstream log;
  starting_point start = load(j, log);
  const model::param_layout layout = start.net.layout();
  // The data's loading lines are not the plan's; a warning goes to stderr.
  const train::plan p = plan_of(j, start, train::topology_of(c, 0, s.threads), layout, c.single_process(), std::cerr);
  if (p.stages.empty()) {
    if (json) throw error("--json: the plan of a pipeline only (give --pipeline-stages K > 1)");
    return p.describe();
  }
  return train::describe_placement(p, s, json);
}

} // namespace troupe::actors

namespace troupe {

std::string describe_plan(const job& j, bool json) { return actors::describe_plan(j, json); }

history fit(const job& j, std::ostream& log) {
  j.validate();
  const auto env = train::environment();
  const train::cluster_spec c = train::resolve(j.cluster_config(), env);
  if (!c.single_process()) {
    if (!runs_on_actors(j.config().algo.kind) && j.config().pipeline.stages <= 1)
      throw error("a cluster of " + std::to_string(c.nodes.size()) +
                  " nodes needs an algorithm on actors (e.g. --algorithm asgd); sequential runs in one process");
    return actors::run_cluster(j, c, train::self_index(c, j.node_name(), env), log);
  }
  if (!runs_on_actors(j.config().algo.kind) && j.config().pipeline.stages <= 1) return train::run_sequential(j, log);
  return actors::run_on_actors(j, log);
}

} // namespace troupe
