// The coordinator actor: epochs, snapshots, records, the end of the run.

#include <caf/all.hpp>

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>
#include <ostream>

#include "actors/allreduce.hpp"
#include "actors/messages.hpp"
#include "net/checkpoint.hpp"
#include "net/protocol.hpp"
#include "actors/node_actor.hpp"
#include "actors/roles.hpp"
#include "model/optimizer.hpp"
#include "train/epoch_accumulator.hpp"
#include "train/loop.hpp"
#include "train/progress.hpp"

namespace troupe::actors {

namespace {

using clock_type = std::chrono::steady_clock;
using watchdog_atom = caf::atom_constant<caf::atom("watchdog")>;
using join_timeout_atom = caf::atom_constant<caf::atom("jointime")>;
using stop_timeout_atom = caf::atom_constant<caf::atom("stoptime")>;
using start_again_atom = caf::atom_constant<caf::atom("startagain")>;

/// A worker of another node that has not reported this long after its start is started again
/// (the start may have been lost on the way; a worker takes only its first).
constexpr std::chrono::seconds start_again{2};

/// A run that shows no progress this long (no worker report, no evaluation) fails.
constexpr std::chrono::seconds stall_timeout{300};
/// How long the coordinator waits for the other nodes to say their actors stopped.
constexpr std::chrono::seconds stop_wait{10};

struct coordinator_state {
  coordinator_setup s;
  std::shared_ptr<const directory> dir;
  std::unique_ptr<train::epoch_accumulator> acc;
  std::unique_ptr<train::progress_reporter> progress;
  std::unique_ptr<train::metrics_file> metrics;
  clock_type::time_point start, last_progress;
  double train_s = 0;                    // the closed epochs' training seconds
  std::map<int, epoch_metrics> pending;  // closed epochs waiting for their evaluation
  train::checkpoint_clock periodic;      // checkpoint-every-steps / -seconds
  std::set<uint32_t> joined;             // nodes whose actors exist and whose links are up
  std::set<uint32_t> lost;               // worker nodes lost (they may join again)
  std::set<uint32_t> gone;               // nodes whose actors stopped or whose link is down
  std::set<uint32_t> stopping;           // other nodes asked to stop, not yet stopped
  std::unique_ptr<link_watch> links;     // this node's links, for the join timeout's verdict
  bool started = false, finishing = false, done = false;
  /// Allreduce: the group being re-formed (docs/algorithms.md, "Elastic membership").
  struct {
    uint64_t epoch = 0;
    uint64_t went = 0;                        // the epoch of the group that went on last (its reports count)
    std::vector<uint32_t> members, joiners;   // worker indices
    std::map<uint32_t, uint64_t> reported;    // member -> the steps it has applied
    std::set<uint32_t> rejoining;             // nodes whose workers join the next group
  } group;
};
using coordinator_t = caf::stateful_actor<coordinator_state>;

const net::address& me(coordinator_t* self) { return self->state.s.plan.coordinator; }

/// Now on the actor system's clock (the steady clock; a test's own clock
/// under CAF's test coordinator): what the stall timeout measures.
clock_type::time_point progress_now(coordinator_t* self) { return self->clock().now(); }

/// The plan's addresses of `role`.
std::vector<net::address> addresses(const train::plan& p, net::role role) {
  std::vector<net::address> out;
  switch (role) {
    case net::role::worker: for (const auto& w : p.workers) out.push_back(w.address); break;
    case net::role::loader: for (const auto& l : p.loaders) out.push_back(l.address); break;
    case net::role::shard: for (const auto& s : p.shards) out.push_back(s.address); break;
    case net::role::stage: for (const auto& s : p.stages) out.push_back(s.address); break;
    case net::role::evaluator: out.push_back(p.evaluator); break;
    default: break;
  }
  return out;
}

void broadcast(coordinator_t* self, net::role role, wire::Control::Kind kind, uint32_t amount = 0) {
  auto& st = self->state;
  for (const net::address& a : addresses(st.s.plan, role)) send_to(*st.dir, a, make_control(me(self), a, kind, amount));
}

/// Stops the loaders and the workers; a worker that holds the parameters
/// (allreduce's first) goes on answering the last snapshot's pull until stop_all.
void stop_training(coordinator_t* self, bool holders_too = false) {
  auto& st = self->state;
  const std::vector<train::shard_plan>& holders = st.s.plan.worker_holders;
  for (const net::address& a : addresses(st.s.plan, net::role::worker)) {
    const bool holds = std::any_of(holders.begin(), holders.end(), [&](const auto& h) { return h.address == a; });
    if (!holds || holders_too) send_to(*st.dir, a, make_control(me(self), a, wire::Control::Kind::STOP));
  }
  broadcast(self, net::role::loader, wire::Control::Kind::STOP);
}

/// Stops every actor of the run; quits once every other node that is still
/// up has said its actors stopped (or after a timeout), so that the stops
/// reach them before this node's links close.
void stop_all(coordinator_t* self) {
  auto& st = self->state;
  stop_training(self, true);
  broadcast(self, net::role::shard, wire::Control::Kind::STOP);
  broadcast(self, net::role::stage, wire::Control::Kind::STOP);
  broadcast(self, net::role::evaluator, wire::Control::Kind::STOP);
  for (uint32_t n : st.joined)
    if (n != me(self).node && !st.gone.count(n)) st.stopping.insert(n);
  if (st.stopping.empty()) {
    self->quit();
    return;
  }
  self->delayed_send(self, stop_wait, stop_timeout_atom::value);
}

void abort_run(coordinator_t* self, const std::string& why, failure kind = failure::other) {
  auto& st = self->state;
  if (st.done) return;
  st.done = true;
  st.s.result->error = why;
  st.s.result->kind = kind;
  stop_all(self);
}

/// Closes the epoch in progress and asks the evaluator for a snapshot of it.
void close_epoch(coordinator_t* self) {
  auto& st = self->state;
  const settings& s = st.s.job->config();
  const double lr = model::scheduled_lr(s.lr, s.schedule, st.acc->steps(), st.s.plan.total_updates, s.warmup_steps);
  const int64_t epoch_samples = st.acc->epoch_samples();
  epoch_metrics m = st.acc->close_epoch(lr, clock_type::now());
  st.train_s += m.train_s;
  snapshot_request req;
  req.epoch = static_cast<uint32_t>(m.epoch);
  // A run cut inside an epoch records where in it: a resumed run trains the rest.
  const bool complete = st.acc->last_closed_complete();
  req.epochs_done = static_cast<uint32_t>(complete ? m.epoch : m.epoch - 1);
  req.epoch_samples = complete ? 0 : static_cast<uint64_t>(epoch_samples);
  req.steps = static_cast<uint64_t>(m.steps);
  req.evaluate = s.evaluate;
  req.checkpoint = !s.checkpoint.empty();
  st.pending[m.epoch] = m;
  send_to(*st.dir, st.s.plan.evaluator, make_snapshot(me(self), st.s.plan.evaluator, req));
}

/// A checkpoint between epochs, when checkpoint-every-* says one is due.
void maybe_checkpoint(coordinator_t* self) {
  auto& st = self->state;
  if (!st.periodic.due(st.acc->steps(), clock_type::now())) return;
  snapshot_request req;
  req.epoch = static_cast<uint32_t>(st.acc->epoch() + 1);
  req.epochs_done = static_cast<uint32_t>(st.acc->epoch());  // epochs done: not the one in progress
  req.epoch_samples = static_cast<uint64_t>(st.acc->epoch_samples());  // a resumed run trains the rest of it
  req.steps = static_cast<uint64_t>(st.acc->steps());
  req.evaluate = false;
  req.checkpoint = true;
  req.periodic = true;
  send_to(*st.dir, st.s.plan.evaluator, make_snapshot(me(self), st.s.plan.evaluator, req));
}

void finish_run(coordinator_t* self) {
  auto& st = self->state;
  const auto& per_worker = st.acc->worker_samples();
  if (per_worker.size() > 1) {
    auto [lo, hi] = std::minmax_element(per_worker.begin(), per_worker.end());
    *st.s.log << "samples trained per worker: min " << *lo << " (worker " << lo - per_worker.begin() << "), max "
              << *hi << " (worker " << hi - per_worker.begin() << ")" << std::endl;
    const std::vector<worker_summary> w = st.acc->worker_summaries();
    auto [few, many] = std::minmax_element(w.begin(), w.end(), [](const worker_summary& a, const worker_summary& b) {
      return a.mean_staleness < b.mean_staleness;
    });
    if (st.s.info.asynchronous)  // a synchronous run's updates are never stale
      *st.s.log << "staleness per worker: mean from " << std::fixed << std::setprecision(2) << few->mean_staleness
                << " (worker " << few->worker << ") to " << many->mean_staleness << " (worker " << many->worker
                << ")" << std::defaultfloat << std::endl;
    const std::string compute = describe_compute(w, st.s.info, st.train_s);
    if (!compute.empty()) *st.s.log << compute << std::endl;
    st.metrics->write(w, st.s.info);
  }
  st.done = true;
  stop_all(self);
}

void on_metrics(coordinator_t* self, const net::envelope_reader& r) {
  auto& st = self->state;
  if (st.finishing) return;  // steps finished after the stop do not count
  train::step_report rep = read_metrics(r);
  rep.worker = st.s.plan.replica_of(net::read_address(r.root().getSource()));  // a pipeline replica's stage
  // An allreduce's step of a group that has been replaced (a worker that was
  // dropped, one ahead whose step was undone): the Regroup's go carried the
  // count without it, and the holder's snapshots count from there.
  if (rep.group != st.group.went) {
    st.acc->count_dropped_report();
    return;
  }
  if (rep.staleness_only) {  // a hybrid's stage before the last: no step
    st.acc->add_staleness(rep);
    return;
  }
  const settings& s = st.s.job->config();
  st.last_progress = progress_now(self);
  if (const auto& f = st.s.job->step_callback()) {
    bool stop = false;
    f(step_event{st.acc->steps() + 1, st.acc->epoch() + 1, rep.loss, rep.worker, &stop});
    if (stop) st.acc->request_stop();
  }
  const auto verdict = st.acc->add(rep);
  st.progress->update(st.acc->epoch() + 1, s.epochs, st.acc->batches_done(s.batch_size), st.s.plan.batches_per_epoch,
                      st.acc->mean_loss(), st.acc->samples_per_s(clock_type::now()));
  if (verdict == train::epoch_accumulator::verdict::train_on) {
    maybe_checkpoint(self);
    return;
  }
  if (verdict == train::epoch_accumulator::verdict::end_run) {
    // The workers stop first, so that the last snapshot holds the final parameters.
    st.finishing = true;
    stop_training(self);
  }
  close_epoch(self);
}

void on_evaluation(coordinator_t* self, const net::envelope_reader& r) {
  auto& st = self->state;
  const evaluation_result e = read_evaluation(r);
  st.last_progress = progress_now(self);
  if (e.periodic) return;  // a checkpoint between epochs: no record
  auto it = st.pending.find(static_cast<int>(e.epoch));
  if (it == st.pending.end()) return;
  epoch_metrics m = it->second;
  st.pending.erase(it);
  st.last_progress = progress_now(self);
  m.test_accuracy = e.test_accuracy;
  m.validation_accuracy = e.validation_accuracy;
  if (e.test_loss >= 0)
    train::set_losses(m, {e.test_accuracy, e.validation_accuracy, e.test_loss, e.validation_loss, e.sample});
  m.wall_s = train::seconds_since(st.start);
  m.peak_rss_mb = train::peak_rss_mb();
  if (st.s.rejections) m.link_rejections = st.s.rejections->totals();
  st.progress->finish_line();
  *st.s.log << train::describe(m, st.s.info) << std::endl;
  st.metrics->write(m, st.s.info);
  st.s.result->epochs.push_back(m);
  if (train::epoch_callback(*st.s.job, m) && !st.finishing) {
    st.finishing = true;
    stop_training(self);
  }
  if (st.finishing && st.pending.empty()) finish_run(self);
}

std::string node_name(coordinator_t* self, uint32_t node) {
  const auto& names = self->state.s.node_names;
  return node < names.size() ? names[node] : "node " + std::to_string(node);
}

/// Starts the loaders (at the epoch in progress) and the workers of `node`.
void start_node(coordinator_t* self, uint32_t node) {
  auto& st = self->state;
  const uint32_t epoch = static_cast<uint32_t>(st.acc->epoch());
  // Loaders first: a worker's first credit then finds its loader at the epoch.
  for (const auto& l : st.s.plan.loaders)
    if (l.address.node == node)
      send_to(*st.dir, l.address, make_control(me(self), l.address, wire::Control::Kind::START, epoch));
  for (const auto& w : st.s.plan.workers)
    if (w.address.node == node) send_to(*st.dir, w.address, make_control(me(self), w.address, wire::Control::Kind::START));
  for (const auto& s : st.s.plan.stages)
    if (s.address.node == node) send_to(*st.dir, s.address, make_control(me(self), s.address, wire::Control::Kind::START));
}

/// Allreduce: the group re-forms among the workers of the nodes not lost; a
/// node that joined again takes the parameters from the others. The workers
/// that stay are held first and report the steps they have applied.
void begin_regroup(coordinator_t* self) {
  auto& st = self->state;
  auto& g = st.group;
  ++g.epoch;
  g.members.clear();
  g.joiners.clear();
  g.reported.clear();
  const auto& workers = st.s.plan.workers;
  for (uint32_t i = 0; i < workers.size(); ++i) {
    if (st.lost.count(workers[i].address.node)) continue;
    g.members.push_back(i);
    if (g.rejoining.count(workers[i].address.node)) g.joiners.push_back(i);
  }
  regroup hold;
  hold.epoch = g.epoch;
  hold.phase = regroup::hold;
  for (uint32_t i : g.members)
    if (std::find(g.joiners.begin(), g.joiners.end(), i) == g.joiners.end())
      send_to(*st.dir, workers[i].address, make_regroup(me(self), workers[i].address, hold));
}

/// A held worker's steps: once every one has reported, the group goes on after the fewest.
void on_regroup_report(coordinator_t* self, const net::envelope_reader& r) {
  auto& st = self->state;
  auto& g = st.group;
  const regroup rep = read_regroup(r);
  if (rep.phase != regroup::report || rep.epoch != g.epoch) return;  // of a group already replaced
  g.reported[net::read_address(r.root().getSource()).index] = rep.step;
  if (g.reported.size() + g.joiners.size() < g.members.size()) return;
  regroup go;
  go.epoch = g.epoch;
  go.phase = regroup::go;
  go.step = std::min_element(g.reported.begin(), g.reported.end(),
                             [](const auto& a, const auto& b) { return a.second < b.second; })->second;
  go.members = g.members;
  go.joiners = g.joiners;
  go.root = g.reported.begin()->first;
  go.reports = static_cast<uint64_t>(st.acc->steps());
  g.went = g.epoch;
  st.acc->count_regroup();
  for (uint32_t i : g.members) {
    const net::address& a = st.s.plan.workers[i].address;
    send_to(*st.dir, a, make_regroup(me(self), a, go));
  }
  g.rejoining.clear();
  *st.s.log << "allreduce: the group goes on with " << g.members.size() << " worker(s) after step " << go.step
            << (g.joiners.empty() ? "" : ", the joining ones taking the parameters from worker " +
                                             std::to_string(go.root))
            << std::endl;
}

/// Whether losing node `node` ends the run (it ran stages, shards, the
/// snapshot replica, or workers the algorithm cannot do without); if so, ends it.
bool ends_run(coordinator_t* self, uint32_t node, const std::string& who, const std::string& why) {
  auto& st = self->state;
  std::string shards, stages;
  for (const auto& s : st.s.plan.shards)
    if (s.address.node == node) shards += (shards.empty() ? "" : ", ") + std::to_string(s.address.index);
  for (const auto& s : st.s.plan.stages)
    if (s.address.node == node) stages += (stages.empty() ? "" : ", ") + std::to_string(s.address.index);
  if (!stages.empty()) {
    abort_run(self, who + " was lost (" + why + "); it ran pipeline stage(s) " + stages +
                        ": the pipeline cannot go on. Run the same command on every node to start again" +
                        (st.s.job->config().checkpoint.empty() ? "." : " from the last checkpoint."),
              failure::lost_node);
    return true;
  }
  if (!shards.empty()) {
    const std::string& ckpt = st.s.job->config().checkpoint;
    abort_run(self, who + " was lost (" + why + "); it held parameter shard(s) " + shards + ". " +
                        (ckpt.empty() ? std::string("The job writes no checkpoint (--checkpoint): it must start over.")
                                      : "Run the same command on every node to resume from the last checkpoint, " + ckpt +
                                            "."),
              failure::lost_node);
    return true;
  }
  for (const auto& h : st.s.plan.worker_holders)
    if (h.address.node == node) {
      abort_run(self, who + " was lost (" + why + "); its worker " + std::to_string(h.address.index) +
                          " held the replica snapshots and checkpoints are taken from. Run the same command on every "
                          "node to start again" +
                          (st.s.job->config().checkpoint.empty() ? "." : " from the last checkpoint."),
                failure::lost_node);
      return true;
    }
  if (!traits(st.s.job->config().algo.kind).survives_lost_workers()) {
    abort_run(self, who + " was lost (" + why + "): " + to_string(st.s.job->config().algo.kind) +
                        " waits for every worker in each round and cannot go on without it",
              failure::lost_node);
    return true;
  }
  return false;
}

/// Node `node`'s transport link is gone: a worker node's workers are lost and
/// the run goes on without them; a shard's node stops the run.
void on_lost(coordinator_t* self, uint32_t node, const std::string& why) {
  auto& st = self->state;
  st.gone.insert(node);
  st.links->down(node, why);
  const std::string who = "node " + node_name(self, node);
  if (!st.started && !st.done) {
    // Nothing is lost yet: the node may join again (the same command) within the join timeout.
    st.joined.erase(node);
    *st.s.log << who << " was lost before training started (" << why << "); waiting for it to join again" << std::endl;
    return;
  }
  if (st.finishing || st.lost.count(node)) return;
  if (ends_run(self, node, who, why)) return;
  st.lost.insert(node);
  int lost_workers = 0, left = 0;
  for (const auto& w : st.s.plan.workers) (st.lost.count(w.address.node) ? lost_workers : left) += 1;
  if (left == 0) {
    abort_run(self, who + " was lost (" + why + "): no worker is left", failure::lost_node);
    return;
  }
  st.acc->set_lost_workers(lost_workers);
  st.progress->finish_line();
  *st.s.log << who << " was lost (" << why << "): training goes on with " << left << " of "
            << st.s.plan.workers.size() << " workers; it joins again by itself when it comes back (or the same "
            << "command on that node)" << std::endl;
  // Should the node still be there (a freeze, a partition, a join that overtook this loss), it
  // learns that its workers were dropped, and joins again, when its link is back.
  const net::address node_actor{node, net::role::node, 0};
  send_to(*st.dir, node_actor, make_control(me(self), node_actor, wire::Control::Kind::LOST, node, why));
  if (traits(st.s.job->config().algo.kind).collective) begin_regroup(self);
}

void on_start(coordinator_t* self);

/// A node's actors exist and its links are up. Training starts when every
/// node has joined; a lost worker node that joins again gets its work back.
void on_join(coordinator_t* self, uint32_t node) {
  auto& st = self->state;
  const net::address node_actor{node, net::role::node, 0};
  send_to(*st.dir, node_actor, make_control(me(self), node_actor, wire::Control::Kind::START));  // the join's answer
  if (st.joined.count(node) && !st.lost.count(node)) return;  // a join sent again
  st.joined.insert(node);
  st.gone.erase(node);
  if (!st.started) {
    if (st.joined.size() == st.s.node_names.size()) on_start(self);
    return;
  }
  if (st.lost.erase(node) && !st.finishing) {
    int lost_workers = 0;
    for (const auto& w : st.s.plan.workers) lost_workers += st.lost.count(w.address.node) ? 1 : 0;
    st.acc->set_lost_workers(lost_workers);
    st.progress->finish_line();
    *st.s.log << "node " << node_name(self, node) << " joined again: its workers go on from the current parameters"
              << std::endl;
    const bool collective = traits(st.s.job->config().algo.kind).collective;
    if (collective) st.group.rejoining.insert(node);
    start_node(self, node);
    if (collective) begin_regroup(self);
  }
}

void on_start(coordinator_t* self) {
  auto& st = self->state;
  const settings& s = st.s.job->config();
  // The first epoch starts now, when every actor exists.
  st.acc = std::make_unique<train::epoch_accumulator>(
      train::epoch_accumulator::limits{st.s.plan.samples_per_epoch, st.s.plan.batches_per_epoch, s.epochs,
                                       st.s.first_epoch, st.s.first_steps, s.max_steps,
                                       static_cast<int>(st.s.plan.stages.empty() ? st.s.plan.workers.size()
                                                                                 : st.s.plan.pipeline_replicas),
                                       st.s.first_epoch_samples},
      clock_type::now());
  st.metrics = std::make_unique<train::metrics_file>(s.metrics_out, st.s.resuming);
  net::check_checkpoint_writable(s.checkpoint);  // before training, not after an epoch
  st.periodic = train::checkpoint_clock(s.checkpoint_every_steps, s.checkpoint_every_s, st.acc->steps(), clock_type::now());
  for (const auto& [a, h] : st.dir->locals())
    if (a != me(self)) self->monitor(h);
  st.started = true;
  if (st.s.node_names.size() > 1) *st.s.log << "every node joined: training starts" << std::endl;
  for (std::size_t n = 0; n < st.s.node_names.size(); ++n) start_node(self, static_cast<uint32_t>(n));
  self->delayed_send(self, std::chrono::seconds(10), watchdog_atom::value);
  if (st.s.node_names.size() > 1) self->delayed_send(self, start_again, start_again_atom::value);
}

/// No run after the join timeout: names the nodes that did not join.
void on_join_timeout(coordinator_t* self) {
  auto& st = self->state;
  if (st.started || st.done) return;
  // Of the nodes that did not join, those without a link to this node are
  // to blame (the others wait for links to them); each with what its link saw.
  std::vector<uint32_t> missing;
  std::vector<bool> linked(st.s.node_names.size());
  for (uint32_t n = 0; n < st.s.node_names.size(); ++n) {
    linked[n] = st.links->is_up(n);
    if (!st.joined.count(n) && n != me(self).node) missing.push_back(n);
  }
  std::ostringstream t;
  t << st.s.join_timeout_s;
  if (missing.empty()) {
    abort_run(self, "node(s) " + node_name(self, me(self).node) + " did not join within " + t.str() + " s",
              failure::timeout);
    return;
  }
  const std::vector<uint32_t> blamed = to_blame(missing, linked);
  std::string names;
  for (uint32_t n : blamed) names += (names.empty() ? "" : ", ") + node_name(self, n);
  abort_run(self, "node(s) " + names + " did not join within " + t.str() + " s: " + st.links->describe(blamed),
            failure::timeout);
}

/// Nodes whose workers (or pipeline replicas' first stages) have not reported yet get their start again.
void on_start_again(coordinator_t* self) {
  auto& st = self->state;
  if (st.done || st.finishing) return;
  const train::plan& p = st.s.plan;
  std::set<uint32_t> silent;
  const auto check = [&](const net::address& a) {
    const uint32_t replica = p.replica_of(a);
    if (replica < st.acc->worker_samples().size() && st.acc->worker_samples()[replica] == 0 && !st.lost.count(a.node))
      silent.insert(a.node);
  };
  for (const auto& w : p.workers) check(w.address);
  for (std::size_t i = 0; i < p.stages.size(); ++i)
    if (i % static_cast<std::size_t>(p.stages_per_replica()) == 0) check(p.stages[i].address);
  for (uint32_t n : silent) start_node(self, n);
  if (!silent.empty()) self->delayed_send(self, start_again, start_again_atom::value);
}

void on_watchdog(coordinator_t* self) {
  auto& st = self->state;
  if (st.done) return;
  if (progress_now(self) - st.last_progress > stall_timeout) {
    abort_run(self, "no progress for " + std::to_string(stall_timeout.count()) + " s: no worker reported a step" +
                        (st.pending.empty() ? std::string() : " and the evaluator did not answer"),
              failure::timeout);
    return;
  }
  self->delayed_send(self, std::chrono::seconds(10), watchdog_atom::value);
}

void on_message(coordinator_t* self, const net::message& m) {
  auto& st = self->state;
  try {
    net::envelope_reader r(m);
    if (!net::accepts(wire::Role::COORDINATOR, r.root().which())) return;  // not for a coordinator: dropped
    if (st.done) {
      // Stopping: only the other nodes' "stopped" (or their loss) counts now.
      if (r.root().which() != wire::Envelope::CONTROL) return;
      auto c = r.root().getControl();
      const uint32_t node = c.getKind() == wire::Control::Kind::LOST ? c.getAmount()
                                                                     : net::read_address(r.root().getSource()).node;
      const bool ended = c.getKind() == wire::Control::Kind::STOPPED || c.getKind() == wire::Control::Kind::LOST;
      if (ended && st.stopping.erase(node) && st.stopping.empty()) self->quit();
      return;
    }
    switch (r.root().which()) {
      case wire::Envelope::METRICS: on_metrics(self, r); break;
      case wire::Envelope::EVALUATION: on_evaluation(self, r); break;
      case wire::Envelope::REGROUP: on_regroup_report(self, r); break;
      case wire::Envelope::CONTROL: {
        auto c = r.root().getControl();
        const net::address from = net::read_address(r.root().getSource());
        switch (c.getKind()) {
          case wire::Control::Kind::ERROR: abort_run(self, c.getDetail(), failure_from(c.getAmount())); break;
          case wire::Control::Kind::JOIN: on_join(self, from.node); break;
          case wire::Control::Kind::LOST: on_lost(self, c.getAmount(), c.getDetail()); break;
          case wire::Control::Kind::STOPPED: st.gone.insert(from.node); break;  // a node whose actors all stopped
          default: break;
        }
        break;
      }
      default:
        break;
    }
  } catch (const std::exception& e) {
    abort_run(self, std::string("coordinator: ") + e.what(), failure_of(e));
  }
}

caf::behavior coordinator_actor(coordinator_t* self, coordinator_setup setup, std::shared_ptr<const directory> dir) {
  auto& st = self->state;
  st.s = std::move(setup);
  st.dir = std::move(dir);
  st.start = clock_type::now();
  st.last_progress = progress_now(self);
  const settings& s = st.s.job->config();
  st.progress = std::make_unique<train::progress_reporter>(*st.s.log, s.progress);
  st.links = std::make_unique<link_watch>(st.s.node_names, me(self).node);
  self->delayed_send(self, std::chrono::milliseconds(static_cast<int64_t>(st.s.join_timeout_s * 1000)),
                     join_timeout_atom::value);
  self->set_down_handler([self](caf::down_msg& d) {
    // Workers and loaders stop normally once the run has begun to finish.
    if (self->state.done || (self->state.finishing && !d.reason)) return;
    abort_run(self, "an actor of the run stopped unexpectedly: " + self->system().render(d.reason));
  });
  return {
      [self](join_timeout_atom) { on_join_timeout(self); },
      // This node's links, from its node actor: what the join timeout reports.
      [self](peer_up_atom, uint32_t node) { self->state.links->up(node); },
      [self](peer_refused_atom, uint32_t node, const std::string& endpoint, const std::string& reason,
             const std::string& what) { self->state.links->refused(node, endpoint, reason, what); },
      [self](start_again_atom) { on_start_again(self); },
      [self](stop_timeout_atom) {
        if (!self->state.stopping.empty()) self->quit();
      },
      [self](watchdog_atom) { on_watchdog(self); },
      [self](const net::message& m) { on_message(self, m); },
  };
}

} // namespace

caf::actor spawn_coordinator(caf::actor_system& sys, coordinator_setup setup, std::shared_ptr<const directory> dir) {
  return sys.spawn(coordinator_actor, std::move(setup), std::move(dir));
}

} // namespace troupe::actors
