// troupe::fit: the sequential loop, or one node's actors from the plan.

#include <caf/all.hpp>

#include <ostream>

#include "actors/fit.hpp"
#include "actors/messages.hpp"
#include "actors/roles.hpp"
#include "net/checkpoint.hpp"
#include "train/loop.hpp"

namespace troupe::actors {

namespace {

/// What a run on actors starts from: the data, the model it evaluates on
/// (its parameters the starting point), and where a resumed run goes on.
struct starting_point {
  std::shared_ptr<const train::loaded_data> data;
  model::model net;
  int first_epoch = 0;
  int64_t first_steps = 0;
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
    log << "resumed from " << j.config().checkpoint << " after epoch " << p.first_epoch << "\n";
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

/// Spawns the parameter shards, from the starting parameters; their kernels
/// (the update rule, NaN scans) use the plan's shard threads of their node.
void spawn_shards(caf::actor_system& sys, const job& j, const train::plan& p, starting_point& start,
                  const std::shared_ptr<directory>& dir, std::ostream& log) {
  const settings& s = j.config();
  const auto params = start.net.parameters();
  for (const auto& sp : p.shards) {
    const kernels::context ctx = kernels::context::with_threads(p.nodes[sp.address.node].shard_threads);
    std::vector<named_tensor> mine;
    for (uint32_t i = sp.range.first; i < sp.range.last; ++i) mine.push_back({params[i]->name, params[i]->value.clone()});
    auto core = std::make_shared<shard_core>(sp, mine, rule_config(s), s.schedule, p.total_updates, ctx);
    if (start.resuming) resume_shard(*core, start.checkpoint, to_string(s.algo.kind), static_cast<int>(p.shards.size()), log);
    dir->add(sp.address, spawn_shard(sys, core, dir, &log));
  }
}

history run_on_actors(const job& j, std::ostream& log) {
  const settings& s = j.config();
  const train::topology topo = train::topology::local(s.threads);
  starting_point start = load(j, log);
  if (start.first_epoch >= s.epochs) return {};
  const model::param_layout layout = start.net.layout();
  const train::plan p = train::make_plan(s, topo, layout, start.data->sets.train.count);
  const bool hogwild = s.algo.kind == algorithm_kind::hogwild;
  auto hw = hogwild ? make_hogwild(start.net) : nullptr;
  log << "model " << j.model_name() << ": " << layout.numel() << " parameters; " << to_string(s.algo.kind) << " with "
      << p.workers.size() << " worker(s), "
      << (hogwild ? std::string("one shared buffer") : std::to_string(p.shards.size()) + " shard(s)") << ", push every "
      << s.algo.push_every << ", " << p.workers.front().threads << " thread(s) per worker\n";

  auto result = std::make_shared<outcome>();
  {
    caf::actor_system_config cfg;
    cfg.set("scheduler.max-threads", static_cast<size_t>(p.nodes[0].scheduler_threads));
    cfg.set("logger.verbosity", caf::atom("quiet"));
    // Several workers need one shared FIFO run queue: work stealing resumes the
    // actor woken last first, which starved workers completely (0 samples for one
    // of 16 CNN workers). A single worker keeps work stealing: twice the throughput.
    if (p.workers.size() > 1) cfg.set("scheduler.policy", caf::atom("sharing"));
    caf::actor_system sys{cfg};
    auto dir = std::make_shared<directory>();
    auto shared_job = std::make_shared<const job>(j);

    // The evaluator's model: the starting parameters, overwritten by each snapshot.
    evaluator_core::config ec{p.evaluator, p.shards, hw, start.data, s.batch_size, s.checkpoint, to_string(s.algo.kind)};
    if (!hogwild) spawn_shards(sys, j, p, start, dir, log);
    auto replicas = std::make_shared<replica_pool>([shared_job, sample = start.data->sets.train.sample_shape()] {
      return shared_job->build_model(sample);
    });
    for (std::size_t i = 0; i < p.workers.size(); ++i) {
      const train::worker_plan& w = p.workers[i];
      auto loader = std::make_shared<loader_core>(start.data->sets.train, start.data->norm, s.batch_size, p.loaders[i],
                                                  start.first_epoch);
      dir->add(p.loaders[i].address, spawn_loader(sys, loader, dir));
      auto core = std::make_shared<worker_core>(w, replicas, make_source(j, p, w, layout, hw));
      dir->add(w.address, spawn_worker(sys, core, p.loaders[i].address, p.coordinator, s.algo.prefetch, dir));
    }
    coordinator_setup cs{shared_job, p, train::info_of(j, topo.nodes[0].threads), start.first_epoch,
                         start.first_steps, start.resuming, &log, result};
    auto evaluator = std::make_shared<evaluator_core>(std::move(ec), std::move(start.net));
    dir->add(p.evaluator, spawn_evaluator(sys, evaluator, p.coordinator, dir));
    caf::actor coordinator = spawn_coordinator(sys, std::move(cs), dir);
    dir->add(p.coordinator, coordinator);

    caf::scoped_actor self{sys};
    self->monitor(coordinator);
    send_to(*dir, p.coordinator, make_control(p.coordinator, p.coordinator, wire::Control::Kind::START));
    self->receive([](const caf::down_msg&) {});
    for (const auto& [a, h] : dir->locals()) caf::anon_send_exit(h, caf::exit_reason::user_shutdown);
  }  // the actor system waits for every actor here
  if (!result->error.empty()) throw error(result->error);
  return result->epochs;
}

} // namespace

} // namespace troupe::actors

namespace troupe {

history fit(const job& j, std::ostream& log) {
  j.validate();
  if (!runs_on_actors(j.config().algo.kind)) return train::run_sequential(j, log);
  return actors::run_on_actors(j, log);
}

} // namespace troupe
