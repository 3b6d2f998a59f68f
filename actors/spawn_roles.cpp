// The role table: one spawner per role, each spawning the plan's entries of
// its role on this node with their initial state, into the node's directory.

#include "actors/spawn_roles.hpp"

#include <caf/all.hpp>

#include <ostream>

#include "actors/allreduce.hpp"
#include "actors/node_actor.hpp"
#include "train/optimizers.hpp"

namespace troupe::actors {

namespace {

using spawner = void (*)(caf::actor_system&, node_context&);

/// Registers `a` at `address` as one of the node's role actors.
void add_local(node_context& c, const net::address& address, caf::actor a) {
  c.dir->add(address, a);
  c.locals.push_back(std::move(a));
}

/// AdamW's groups of `range` of `net`'s parameters: the size of its part of each
/// tensor it overlaps, and whether weight decay applies to it (train::decays:
/// the matrices only; a cut matrix's part decays as the matrix does).
void adamw_groups(model::model& net, const model::param_layout& layout, const model::shard_range& range,
                  std::vector<int64_t>& segments, std::vector<bool>& decays) {
  const std::vector<model::parameter*> params = net.parameters();
  for (uint32_t t = range.first; t < range.last; ++t) {
    segments.push_back(model::part_of(layout, t, range).numel());
    decays.push_back(train::decays(params[t]->name, params[t]->value.shape()));
  }
}

/// A shard's starting tensors: each tensor of its range, or its part of a cut
/// one, flat, named "name[begin:end]" by the elements of the tensor it holds.
std::vector<named_tensor> shard_tensors(model::model& net, const model::param_layout& layout,
                                        const model::shard_range& range) {
  const std::vector<model::parameter*> params = net.parameters();
  std::vector<named_tensor> out;
  for (uint32_t t = range.first; t < range.last; ++t) {
    const model::tensor_part p = model::part_of(layout, t, range);
    if (p.whole) {
      out.push_back({params[t]->name, params[t]->value.clone()});
      continue;
    }
    const int64_t from = p.begin - layout[t].offset, to = p.end - layout[t].offset;
    tensor part = tensor::empty({p.numel()});
    std::copy(params[t]->value.data() + from, params[t]->value.data() + to, part.data());
    out.push_back({params[t]->name + "[" + std::to_string(from) + ":" + std::to_string(to) + "]", std::move(part)});
  }
  return out;
}

void spawn_shards(caf::actor_system& sys, node_context& c) {
  const train::plan& p = c.plan();
  const model::param_layout layout = c.start->net.layout();
  for (std::size_t i = 0; i < p.shards.size(); ++i) {
    const train::shard_plan& sp = p.shards[i];
    if (sp.address.node != c.self) continue;
    const kernels::context ctx = kernels::context::with_threads(p.nodes[c.self].shard_threads);
    const std::vector<named_tensor> mine = shard_tensors(c.start->net, layout, sp.range);
    model::update_config rule = rule_config(c.config());
    adamw_groups(c.start->net, layout, sp.range, rule.segments, rule.segment_decays);
    auto core = std::make_shared<shard_core>(sp, mine, rule, c.config().schedule, p.total_updates, ctx);
    if (c.start->state.resuming) resume_shard(*core, c.start->state.shards[i], *c.log);
    core->trace(c.trace);
    add_local(c, sp.address, spawn_shard(sys, core, c.dir, c.log));
  }
}

/// The optimizer of a stage's or an allreduce replica's flat parameters
/// (`range` of the model's), as the job's settings say, over `total_steps` updates.
model::flat_optimizer_options optimizer_of(const node_context& c, const model::shard_range& range, int64_t total_steps) {
  const settings& s = c.config();
  model::flat_optimizer_options o;
  o.adamw = s.optimizer == optimizer_kind::adamw;
  if (o.adamw) adamw_groups(c.start->net, c.start->net.layout(), range, o.segments, o.segment_decays);
  o.lr = s.lr;
  o.momentum = s.momentum;
  o.weight_decay = s.weight_decay;
  o.clip_grad_norm = s.clip_grad_norm;
  o.schedule = s.schedule;
  o.total_steps = total_steps;
  o.warmup_steps = s.warmup_steps;
  return o;
}

/// Mini-batches a stage runs. A hybrid's replicas go on until the coordinator
/// has counted the run's samples (an epoch ends on every replica's samples
/// together, as data-parallel workers'): each may take up to all of them. A
/// resumed run takes at least one step, as workers and the sequential loop do
/// (the coordinator ends the run on the first report past --max-steps).
int64_t stage_steps(const node_context& c) {
  const settings& s = c.config();
  const train::plan& p = c.plan();
  const int64_t before = c.start->state.first_steps;
  int64_t steps = p.total_updates * (traits(s.algo.kind).synchronous ? p.pipeline_replicas : 1) - before;
  if (s.max_steps > 0) steps = std::min(steps, s.max_steps - before);
  return std::max<int64_t>(1, steps);
}

/// 1F1B's flush points, in micro-batches from this start: after each epoch's
/// last mini-batch and each --checkpoint-every-steps multiple (mini-batches
/// counted from the run's first), so that a checkpoint taken there holds
/// nothing in flight and a run resumed from it goes on as the uninterrupted
/// one. None for GPipe (it drains after every mini-batch) and for an
/// asynchronous hybrid (its epochs end on its replicas' samples together).
std::vector<int64_t> flush_points(const node_context& c, int64_t steps) {
  const settings& s = c.config();
  const train::plan& p = c.plan();
  if (s.pipeline.schedule != model::pipeline_schedule::one_f_one_b) return {};
  if (p.pipeline_replicas > 1 && !traits(s.algo.kind).collective) return {};
  const int64_t per_epoch = p.batches_per_epoch / std::max(1, p.pipeline_replicas);
  const int64_t before = c.start->state.first_steps;
  std::vector<int64_t> out;
  for (int64_t b = before + 1; b < before + steps; ++b)
    if ((per_epoch > 0 && b % per_epoch == 0) || (s.checkpoint_every_steps > 0 && b % s.checkpoint_every_steps == 0))
      out.push_back((b - before) * s.pipeline.micro_batches);
  return out;
}

/// Stage `i` of the plan's stages: its neighbours, schedule and optimizer.
stage_config stage_config_of(const node_context& c, std::size_t i, int64_t steps) {
  const settings& s = c.config();
  const train::plan& p = c.plan();
  const train::stage_plan& sp = p.stages[i];
  const int stages = p.stages_per_replica();
  const int k = static_cast<int>(i) % stages;
  stage_config sc;
  sc.plan = sp;
  sc.index = k;
  sc.stages = stages;
  sc.previous = k > 0 ? p.stages[i - 1].address : sp.address;
  sc.next = k + 1 < stages ? p.stages[i + 1].address : sp.address;
  sc.coordinator = p.coordinator;
  if (sp.shard >= 0) sc.shard = p.shards[static_cast<std::size_t>(sp.shard)].address;
  sc.layout = c.start->net.layout();
  sc.schedule = s.pipeline.schedule;
  sc.micro_batches = s.pipeline.micro_batches;
  sc.total_micro_batches = steps * s.pipeline.micro_batches;
  sc.flush_after = flush_points(c, steps);
  sc.opt = optimizer_of(c, sp.params, p.total_updates);
  sc.opt.clip_grad_norm = 0;  // a norm per stage is not the model's: the stages sum theirs (clip_grad_norm)
  if (s.clip_grad_norm > 0) {  // the norm over this replica's stages
    sc.clip_grad_norm = s.clip_grad_norm;
    const std::size_t first = i - static_cast<std::size_t>(k);
    for (int j = 0; j < stages; ++j) sc.pipeline.push_back(p.stages[first + static_cast<std::size_t>(j)].address);
  }
  sc.steps_before = c.start->state.first_steps;
  sc.stash = s.pipeline.stash;
  sc.trace = c.trace;
  if (traits(s.algo.kind).collective && p.pipeline_replicas > 1) {  // stage k of every replica reduces together
    for (int r = 0; r < p.pipeline_replicas; ++r) sc.peers.push_back(p.stages[static_cast<std::size_t>(r * stages + k)].address);
    sc.member = sp.replica;
    sc.snapshot_replicas = p.pipeline_replicas;
  }
  return sc;
}

/// Continues a stage that updates its own parameters from its initial state (its optimizer's).
void resume_stage(stage_core& stage, const train::holder_start& h, std::ostream& log) {
  const std::string fresh = net::to_string(stage.address()) + ": the optimizer state starts at 0: ";
  if (!h.fresh.empty()) log << fresh << h.fresh << "\n";
  if (!h.resumes()) return;
  try {
    stage.restore(h.state);
  } catch (const error& e) {
    log << fresh << e.what() << "\n";
  }
}

void spawn_stages(caf::actor_system& sys, node_context& c) {
  const train::plan& p = c.plan();
  if (p.stages.empty()) return;
  const model::model::flat_buffers flat = c.start->net.flatten();
  const int64_t steps = stage_steps(c);
  for (std::size_t i = 0; i < p.stages.size(); ++i) {
    const train::stage_plan& sp = p.stages[i];
    if (sp.address.node != c.self) continue;
    // A stage's model: the whole model built (same seed), its layers cut out.
    model::model net = train::build_model(*c.job, *c.start->data).slice(sp.first_layer, sp.last_layer);
    std::vector<float> initial(flat.values.data() + sp.params.begin, flat.values.data() + sp.params.end);
    auto core = std::make_shared<stage_core>(stage_config_of(c, i, steps), std::move(net), std::move(initial));
    if (c.start->state.resuming) resume_stage(*core, c.start->state.stages[i], *c.log);
    const net::address loader = p.loaders[static_cast<std::size_t>(sp.replica)].address;
    add_local(c, sp.address, spawn_stage(sys, core, loader, p.coordinator, c.config().algo.prefetch, c.dir));
  }
}

/// A worker's or a first stage's loader: its part of the training set, from the epoch the run starts at.
void spawn_loaders(caf::actor_system& sys, node_context& c) {
  const train::plan& p = c.plan();
  const train::initial_state& st = c.start->state;
  for (const train::loader_plan& lp : p.loaders) {
    if (lp.address.node != c.self) continue;
    const train::loaded_data& d = *c.start->data;
    auto core = d.text ? std::make_shared<loader_core>(*d.text, c.config().batch_size, lp, st.first_epoch)
                       : std::make_shared<loader_core>(d.sets.train, d.norm, c.config().batch_size, lp, st.first_epoch);
    core->skip_trained(st.epoch_samples, p.samples_per_epoch);
    core->trace(c.trace);
    add_local(c, lp.address, spawn_loader(sys, core, p.coordinator, c.dir));
  }
}

/// An allreduce's worker: its place in the group, the starting replica (a resumed run's optimizer state).
allreduce_config allreduce_of(const node_context& c, const train::worker_plan& w, const std::vector<float>& initial) {
  const settings& s = c.config();
  const train::plan& p = c.plan();
  allreduce_config a;
  for (const train::worker_plan& o : p.workers) {
    if (o.address == w.address) a.member = static_cast<int32_t>(a.members.size());
    a.members.push_back(o.address);
  }
  a.layout = c.start->net.layout();
  a.initial = initial;
  a.elastic = p.nodes.size() > 1;
  a.opt = optimizer_of(c, {0, static_cast<uint32_t>(a.layout.size()), 0, a.layout.numel()}, p.total_updates);
  for (const named_tensor& t : c.start->state.replicas.state)
    if (t.name == model::flat_optimizer::state_name_of(a.opt.adamw)) a.state.assign(t.value.data(), t.value.data() + t.value.numel());
  a.steps_before = c.start->state.replicas.version;
  a.reports_before = static_cast<uint64_t>(c.start->state.first_steps);
  a.bucket_elements = static_cast<int64_t>(s.algo.bucket_mb * 1048576.0 / sizeof(float));
  a.options.bf16(s.algo.allreduce_dtype == reduce_dtype::bf16);
  a.holder = !p.worker_holders.empty() && p.worker_holders.front().address == w.address;
  a.last_report = static_cast<uint64_t>(std::max<int64_t>(0, s.max_steps));
  a.snapshot_every = static_cast<uint64_t>(std::max<int64_t>(0, s.checkpoint_every_steps));
  const std::string& fresh = c.start->state.replicas.fresh;
  if (a.holder && !fresh.empty()) *c.log << "allreduce: the replicas' optimizer state starts at 0: " << fresh << "\n";
  return a;
}

/// Where a worker's weights come from: Hogwild!'s shared buffer, the shards,
/// local steps between pushes, or its own replica in an allreduce (starting from `initial`).
std::unique_ptr<weight_source> weights_of(const node_context& c, const train::worker_plan& w,
                                          const std::vector<float>& initial) {
  const settings& s = c.config();
  if (c.hogwild)
    return hogwild_weights(c.hogwild, s.lr, s.schedule, c.plan().total_updates, s.warmup_steps, s.clip_grad_norm);
  if (traits(s.algo.kind).collective) return allreduce_weights(allreduce_of(c, w, initial));
  shard_source_config sc{w.address, c.plan().shards, c.start->net.layout(), s.clip_grad_norm};
  if (s.algo.push_every > 1)
    return local_steps(sc, s.algo.push_every, s.algo.worker_lr > 0 ? s.algo.worker_lr : s.lr, s.algo.worker_momentum);
  return shard_weights(sc);
}

void spawn_workers(caf::actor_system& sys, node_context& c) {
  const settings& s = c.config();
  const train::plan& p = c.plan();
  // Workers borrow replicas for their steps: as many exist as steps run at once.
  auto replicas = std::make_shared<replica_pool>(
      [job = c.job, data = c.start->data] { return train::build_model(*job, *data); });
  const auto retry = std::chrono::milliseconds(static_cast<int64_t>(p.pull_retry_s * 1000));
  std::vector<float> initial;  // an allreduce's starting replica, the same for every worker of the node
  if (traits(s.algo.kind).collective) {
    const model::model::flat_buffers flat = c.start->net.flatten();
    initial.assign(flat.values.data(), flat.values.data() + flat.values.numel());
  }
  for (const train::worker_plan& w : p.workers) {
    if (w.address.node != c.self) continue;
    auto core = std::make_shared<worker_core>(w, replicas, weights_of(c, w, initial));
    // Pipelined execution; a slowed worker holds its pushes back, so it pushes after backward.
    if (s.algo.overlap && w.speed <= 1.0f)
      core->overlap([dir = c.dir](outgoing&& o) { send_to(*dir, o.to, std::move(o.msg), o.priority); },
                    s.algo.overlap_receive);
    if (c.trace) core->trace(c.trace, net::to_string(w.address));
    add_local(c, w.address, spawn_worker(sys, core, w.loader, p.coordinator, s.algo.prefetch, retry, c.dir));
  }
}

/// The evaluator's model: the starting parameters, overwritten by each snapshot.
void spawn_evaluator_role(caf::actor_system& sys, node_context& c) {
  const train::plan& p = c.plan();
  if (p.evaluator.node != c.self) return;
  evaluator_core::config ec;
  ec.self = p.evaluator;
  ec.shards = p.parameter_holders();
  ec.hogwild = c.hogwild;
  ec.data = c.start->data;
  ec.batch_size = c.config().batch_size;
  ec.sample_tokens = c.config().sample_tokens;
  ec.checkpoint = c.config().checkpoint;
  ec.algorithm = to_string(c.config().algo.kind);
  auto core = std::make_shared<evaluator_core>(std::move(ec), std::move(c.start->net));
  c.dir->add(p.evaluator, spawn_evaluator(sys, core, p.coordinator, c.dir));
}

void spawn_coordinator_role(caf::actor_system& sys, node_context& c) {
  const train::plan& p = c.plan();
  if (p.coordinator.node != c.self) return;
  const train::initial_state& st = c.start->state;
  coordinator_setup cs;
  cs.job = c.job;
  cs.plan = p;
  cs.info = c.info;
  cs.first_epoch = st.first_epoch;
  cs.first_steps = st.first_steps;
  cs.resuming = st.resuming;
  cs.node_names = c.node_names;
  cs.join_timeout_s = c.join_timeout_s;
  cs.log = c.log;
  cs.result = c.result;
  cs.rejections = c.rejections;
  cs.first_epoch_samples = st.epoch_samples;
  c.dir->add(p.coordinator, spawn_coordinator(sys, std::move(cs), c.dir));
}

/// The roles in the order they are spawned; none sends before the node's actor starts.
struct role_entry {
  net::role role;
  spawner spawn;
};
const role_entry role_table[] = {
    {net::role::shard, spawn_shards},          {net::role::stage, spawn_stages},
    {net::role::loader, spawn_loaders},        {net::role::worker, spawn_workers},
    {net::role::evaluator, spawn_evaluator_role}, {net::role::coordinator, spawn_coordinator_role},
};

} // namespace

caf::actor spawn_roles(caf::actor_system& sys, node_context& c) {
  for (const role_entry& r : role_table) r.spawn(sys, c);
  const caf::actor* coordinator = c.dir->local(c.plan().coordinator);
  node_setup ns;
  ns.self = c.self;
  ns.node_names = c.node_names;
  ns.coordinator = c.plan().coordinator;
  ns.join_timeout_s = c.join_timeout_s;
  if (!coordinator) ns.locals = c.locals;
  ns.result = c.result;
  ns.log = c.log;
  caf::actor node = spawn_node_actor(sys, std::move(ns), c.dir);
  c.dir->add({c.self, net::role::node, 0}, node);
  caf::anon_send(node, node_start_atom::value);
  return coordinator ? *coordinator : node;
}

} // namespace troupe::actors
