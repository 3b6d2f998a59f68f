// The data loader, worker, parameter shard and evaluator actors on CAF 0.17.
// They only move net::message values and call their cores.

#include <caf/all.hpp>

#include <chrono>
#include <deque>
#include <optional>
#include <ostream>

#include "actors/messages.hpp"
#include "net/protocol.hpp"
#include "actors/roles.hpp"
#include "train/metrics.hpp"

namespace troupe::actors {

namespace {

using clock_type = std::chrono::steady_clock;
using release_atom = caf::atom_constant<caf::atom("release")>;
using go_on_atom = caf::atom_constant<caf::atom("go_on")>;
using timeout_atom = caf::atom_constant<caf::atom("timeout")>;
using retry_atom = caf::atom_constant<caf::atom("retry")>;

/// How long the evaluator waits for the shards' answers to a snapshot.
constexpr std::chrono::seconds snapshot_timeout{120};
/// How often the evaluator pulls again the shards that have not answered a snapshot.
constexpr std::chrono::seconds snapshot_retry{2};

struct control_view {
  wire::Control::Kind kind;
  uint32_t amount;
};

control_view read_control(const net::envelope_reader& r) {
  auto c = r.root().getControl();
  return {c.getKind(), c.getAmount()};
}


/// Tells the coordinator why this actor fails, then stops it.
template <class Self>
void fail(Self* self, const directory& dir, const net::address& me, const net::address& coordinator,
          const std::string& why, failure kind = failure::other) {
  try {
    // The failure's kind travels in `amount`: fit throws its type.
    send_to(dir, coordinator,
            make_control(me, coordinator, wire::Control::Kind::ERROR, static_cast<uint32_t>(kind), why));
  } catch (const std::exception&) {
    // No coordinator to tell: the down message says it.
  }
  self->quit(caf::make_error(caf::sec::runtime_error, why));
}

// --- data loader ---

caf::behavior loader_actor(caf::event_based_actor* self, std::shared_ptr<loader_core> c, net::address coordinator,
                           std::shared_ptr<const directory> dir) {
  return {
      [self, c, coordinator, dir](const net::message& m) {
        try {
          const net::envelope_reader r(m);  // opened and validated once
          if (!net::accepts(wire::Role::LOADER, r.root().which())) return;  // net/protocol.cpp: Control only
          const control_view cv = read_control(r);
          if (cv.kind == wire::Control::Kind::STOP) {
            self->quit();
            return;
          }
          if (cv.kind == wire::Control::Kind::START) c->restart(static_cast<int>(cv.amount));
          // One batch per credit: at most `prefetch` batches per worker exist at a time.
          if (cv.kind == wire::Control::Kind::CREDIT)
            for (uint32_t i = 0; i < cv.amount; ++i) send_to(*dir, c->worker(), c->next());
        } catch (const std::exception& e) {
          fail(self, *dir, c->address(), coordinator, net::to_string(c->address()) + ": " + e.what(), failure_of(e));
        }
      },
  };
}

// --- worker ---

struct worker_state {
  std::chrono::milliseconds reply_timeout{0};  // 0: answers never get lost (one process); else the longest wait
  uint64_t pushes = 0;                          // pushes sent: the retry timer's generation
  clock_type::time_point pushed_at;             // when the last push went out
  double reply_s = 0;                           // running mean of a push's round trip
  bool waiting = false;                         // for the answers to the last push
  bool started = false;                         // a start sent again (lost on the way?) is ignored
  std::shared_ptr<worker_core> core;
  std::shared_ptr<const directory> dir;
  net::address loader, coordinator;
  std::deque<net::opened_message> batches;
  std::vector<outgoing> held;  // pushes delayed by the speed factor
  int prefetch = 2;
  bool busy = false;
  bool idle = false;                            // since `idle_since`: no step possible (the trace's "wait")
  clock_type::time_point idle_since;
};
using worker_actor_t = caf::stateful_actor<worker_state>;

/// How long to wait for a push's answers before pulling again: 8 x the
/// usual round trip, at least 20 ms, at most the configured reply timeout.
std::chrono::microseconds retry_after(const worker_state& st) {
  const double s = std::min(std::max(8 * st.reply_s, 0.02), st.reply_timeout.count() / 1000.0);
  return std::chrono::microseconds(static_cast<int64_t>(s * 1e6));
}

void worker_report(worker_actor_t* self) {
  auto& st = self->state;
  if (st.waiting && st.core->ready()) {
    st.waiting = false;
    const double rt = train::seconds_since(st.pushed_at);
    st.reply_s = st.reply_s == 0 ? rt : 0.9 * st.reply_s + 0.1 * rt;
  }
  if (st.core->report_due())
    send_to(*st.dir, st.coordinator, make_metrics(st.core->address(), st.coordinator, st.core->report()));
}

/// Sends the step's pushes; `sent_before`: some went out during backward.
void worker_send(worker_actor_t* self, std::vector<outgoing>& pushes, bool sent_before = false) {
  auto& st = self->state;
  const bool pushed = sent_before || !pushes.empty();
  for (auto& p : pushes) send_to(*st.dir, p.to, std::move(p.msg));
  pushes.clear();
  worker_report(self);
  // Across nodes a push or its answer can be lost: pull again if no answer came in time.
  if (pushed && st.reply_timeout.count() > 0) {
    st.waiting = true;
    st.pushed_at = clock_type::now();
    self->delayed_send(self, retry_after(st), retry_atom::value, ++st.pushes);
  }
}

/// Steps while the weights and batches allow: a new step, or the paused one
/// once its next layer's weights are here (receiving per layer), or, on its
/// go_on message (`go_on`), the one whose backward let messages in: that
/// message comes after those that arrived meanwhile, which are handled first.
void worker_try_step(worker_actor_t* self, bool go_on = false) {
  auto& st = self->state;
  while (!st.busy) {
    worker_core::step_out out;
    const auto t0 = clock_type::now();
    if (st.core->yielded()) {
      if (!go_on) break;
      go_on = false;
      out = st.core->go_on();
    } else {
      const bool resume = st.core->paused();
      if (resume ? !st.core->can_resume() : !st.core->can_step() || st.batches.empty()) break;
      if (st.idle) {  // the trace's "wait": for parameters or a batch
        st.idle = false;
        st.core->trace_span("wait", st.idle_since, clock_type::now());
      }
      if (resume) {
        out = st.core->resume();
      } else {
        net::opened_message b = std::move(st.batches.front());
        st.batches.pop_front();
        const net::address& me = st.core->address();
        send_to(*st.dir, st.loader, make_control(me, st.loader, wire::Control::Kind::CREDIT, 1));
        out = st.core->step(b);
      }
    }
    if (out.yielded) {
      self->send(self, go_on_atom::value);
      return;
    }
    if (out.paused) break;  // until the next layer's weights arrive
    const float speed = st.core->plan().speed;
    if (speed > 1.0f) {
      // A device `speed` times slower: hold the result for (speed - 1) x the
      // compute time (a slowed worker does not overlap, so its step never pauses).
      const double extra = (speed - 1.0f) * train::seconds_since(t0);
      st.busy = true;
      st.held = std::move(out.pushes);
      self->delayed_send(self, std::chrono::microseconds(static_cast<int64_t>(extra * 1e6)), release_atom::value);
      return;
    }
    worker_send(self, out.pushes, out.sent_during_backward > 0);
  }
  if (!st.idle && !st.busy && !st.core->yielded()) {
    st.idle = true;
    st.idle_since = clock_type::now();
  }
}

/// Runs `f`, a step or a message's handling: one that throws fails the worker
/// loudly (a malformed reply or a diverged step cannot be trained on) rather
/// than let the run hang.
template <class F>
void worker_guarded(worker_actor_t* self, F&& f) {
  auto& st = self->state;
  try {
    f();
  } catch (const std::exception& e) {
    fail(self, *st.dir, st.core->address(), st.coordinator, net::to_string(st.core->address()) + ": " + e.what(),
         failure_of(e));
  }
}

void worker_on_message(worker_actor_t* self, const net::message& m) {
  auto& st = self->state;
  // Opened and validated once (with the finite-value scan): the core reads the checked view.
  const net::opened_message r = st.core->open(m);
  switch (r->root().which()) {
    case wire::Envelope::BATCH:
      st.batches.push_back(r);
      break;
    case wire::Envelope::PARAMS:
      st.core->on_params(r);
      if (!st.busy) worker_report(self);
      break;
    case wire::Envelope::COLLECTIVE:
      for (auto& o : st.core->on_collective(r)) send_to(*st.dir, o.to, std::move(o.msg));
      if (!st.busy) worker_report(self);
      break;
    case wire::Envelope::PULL_PARAMS:
      for (auto& o : st.core->on_pull(r)) send_to(*st.dir, o.to, std::move(o.msg));
      break;
    case wire::Envelope::REGROUP:
      for (auto& o : st.core->on_regroup(r)) send_to(*st.dir, o.to, std::move(o.msg));
      if (!st.busy) worker_report(self);
      break;
    case wire::Envelope::CONTROL: {
      const control_view cv = read_control(*r);
      if (cv.kind == wire::Control::Kind::STOP) {
        self->quit();
        return;
      }
      if (cv.kind == wire::Control::Kind::START && !st.started) {
        st.started = true;
        const net::address& me = st.core->address();
        send_to(*st.dir, st.loader, make_control(me, st.loader, wire::Control::Kind::CREDIT, st.prefetch));
        for (auto& p : st.core->start()) send_to(*st.dir, p.to, std::move(p.msg));
        // The first pulls can be lost too (a node frozen right after its start): ask again as after a push.
        if (st.reply_timeout.count() > 0) {
          st.waiting = true;
          st.pushed_at = clock_type::now();
          self->delayed_send(self, retry_after(st), retry_atom::value, ++st.pushes);
        }
      }
      break;
    }
    default:
      break;
  }
  worker_try_step(self);
}

caf::behavior worker_actor(worker_actor_t* self, std::shared_ptr<worker_core> core, net::address loader,
                           net::address coordinator, int prefetch, std::chrono::milliseconds reply_timeout,
                           std::shared_ptr<const directory> dir) {
  auto& st = self->state;
  st.reply_timeout = reply_timeout;
  st.core = std::move(core);
  st.dir = std::move(dir);
  st.loader = loader;
  st.coordinator = coordinator;
  st.prefetch = prefetch;
  // A slowed worker's hold is timed over its whole step: it does not let messages in during backward.
  st.core->yield_in_backward(st.core->plan().speed <= 1.0f);
  return {
      [self](retry_atom, uint64_t push) {
        auto& st = self->state;
        if (push != st.pushes || st.core->ready()) return;
        for (auto& p : st.core->retry()) send_to(*st.dir, p.to, std::move(p.msg));
        self->delayed_send(self, retry_after(st), retry_atom::value, push);
      },
      [self](release_atom) {
        auto& st = self->state;
        st.busy = false;
        worker_send(self, st.held);
        worker_guarded(self, [self] { worker_try_step(self); });
      },
      [self](go_on_atom) { worker_guarded(self, [self] { worker_try_step(self, true); }); },
      [self](const net::message& m) { worker_guarded(self, [self, &m] { worker_on_message(self, m); }); },
  };
}

// --- parameter shard ---

struct shard_state {
  std::shared_ptr<shard_core> core;
  std::shared_ptr<const directory> dir;
  uint64_t logged_rejects = 0;
};

caf::behavior shard_actor(caf::stateful_actor<shard_state>* self, std::shared_ptr<shard_core> core,
                          std::shared_ptr<const directory> dir, std::ostream* log) {
  self->state.core = std::move(core);
  self->state.dir = std::move(dir);
  return {
      [self, log](const net::message& m) {
        auto& st = self->state;
        auto replies = st.core->handle(m);
        if (st.core->stop_requested()) {
          self->quit();
          return;
        }
        if (st.core->rejects().total() > st.logged_rejects && log) {
          // The first rejection per shard only: a flood of bad messages must not flood the log.
          if (st.logged_rejects == 0)
            *log << net::to_string(st.core->address()) << " rejected a message: " << st.core->last_error() << std::endl;
          st.logged_rejects = st.core->rejects().total();
        }
        // A shard's index is its place in the layout: the first layers' weights,
        // which a worker's forward pass needs first, overtake the others on a link.
        const int priority = static_cast<int>(st.core->address().index);
        for (auto& r : replies) send_to(*st.dir, r.to, std::move(r.msg), priority);
      },
  };
}

// --- pipeline stage ---

struct stage_state {
  std::shared_ptr<stage_core> core;
  std::shared_ptr<const directory> dir;
  net::address loader, coordinator;
  int prefetch = 2;
  int64_t credited = 0;                  // batches asked of the loader (first stage)
  bool waiting = false;                  // for an input, since `waiting_since`
  clock_type::time_point waiting_since;
  std::string track;
  bool busy = false;                     // an emulated slower device: holding `held` until release_atom
  stage_core::result held;
  std::optional<device_pace> pace;       // of its device, when an emulated slower one
  clock_type::time_point hold_until;     // when the current hold is due to end
  clock_type::time_point hold_from;      // when it began (traced as the action's "device" time)
  int64_t hold_micro_batch = -1;         // the held action's micro-batch (-1: an update)
};
using stage_actor_t = caf::stateful_actor<stage_state>;

void stage_send(stage_actor_t* self, stage_core::result& r) {
  auto& st = self->state;
  for (auto& m : r.messages) send_to(*st.dir, m.to, std::move(m.msg));
  for (auto& rep : r.reports) send_to(*st.dir, st.coordinator, make_metrics(st.core->address(), st.coordinator, rep));
  r = {};
}

void stage_step(stage_actor_t* self) {
  auto& st = self->state;
  const net::address& me = st.core->address();
  if (st.waiting && !st.core->waiting() && st.core->config().trace) {
    st.core->config().trace->span(st.track, "wait", st.waiting_since, clock_type::now());
    st.waiting = false;
  }
  // One action at a time, its output sent at once: the next stage starts on
  // a micro-batch while this one computes the next.
  while (!st.busy) {
    const auto t0 = clock_type::now();
    stage_core::result r = st.core->run(1);
    if (r.actions == 0) {  // nothing to compute; an allreduce's pieces (and pulls they made due) still go
      if (!r.messages.empty()) stage_send(self, r);
      break;
    }
    if (st.pace) {
      const double extra = st.pace->hold(r.last, train::seconds_since(t0));
      st.hold_from = clock_type::now();
      st.hold_micro_batch = r.last_micro_batch;
      st.hold_until = st.hold_from + std::chrono::microseconds(static_cast<int64_t>(extra * 1e6));
      st.busy = true;
      st.held = std::move(r);
      self->delayed_send(self, std::chrono::microseconds(static_cast<int64_t>(extra * 1e6)), release_atom::value);
      break;
    }
    stage_send(self, r);
  }
  // One credit per mini-batch taken: at most `prefetch` batches wait at the first stage.
  const int64_t want = st.core->batches_taken() + st.prefetch;
  if (st.core->config().index == 0 && st.credited > 0 && want > st.credited) {
    send_to(*st.dir, st.loader,
            make_control(me, st.loader, wire::Control::Kind::CREDIT, static_cast<uint32_t>(want - st.credited)));
    st.credited = want;
  }
  if (!st.waiting && !st.busy && st.core->waiting()) {
    st.waiting = true;
    st.waiting_since = clock_type::now();
  }
}

caf::behavior stage_actor(stage_actor_t* self, std::shared_ptr<stage_core> core, net::address loader,
                          net::address coordinator, int prefetch, std::shared_ptr<const directory> dir) {
  auto& st = self->state;
  st.core = std::move(core);
  st.dir = std::move(dir);
  st.loader = loader;
  st.coordinator = coordinator;
  st.prefetch = prefetch;
  st.track = net::to_string(st.core->address());
  if (device_pace pace(st.core->config().plan); pace.holds()) st.pace = pace;
  return {
      [self](release_atom) {
        auto& st = self->state;
        st.busy = false;
        if (st.pace) st.pace->ended_late(train::seconds_since(st.hold_until));
        // The emulated device was busy with the action while it held it: its trace shows so.
        if (const auto& t = st.core->config().trace) t->span(st.track, "device", st.hold_from, clock_type::now(), st.hold_micro_batch);
        try {
          stage_send(self, st.held);
          stage_step(self);
        } catch (const std::exception& e) {
          fail(self, *st.dir, st.core->address(), st.coordinator, net::to_string(st.core->address()) + ": " + e.what(),
               failure_of(e));
        }
      },
      [self](const net::message& m) {
        auto& st = self->state;
        const net::address& me = st.core->address();
        try {
          // Opened and validated once: the core keeps the checked view until the input's backward.
          const net::opened_message r = st.core->open(m);
          switch (r->root().which()) {
            case wire::Envelope::CONTROL: {
              const control_view cv = read_control(*r);
              if (cv.kind == wire::Control::Kind::STOP) {
                self->quit();
                return;
              }
              if (cv.kind == wire::Control::Kind::START)
                for (outgoing& o : st.core->start()) send_to(*st.dir, o.to, std::move(o.msg));
              if (cv.kind == wire::Control::Kind::START && st.core->config().index == 0 && st.credited == 0) {
                st.credited = st.prefetch;
                send_to(*st.dir, st.loader, make_control(me, st.loader, wire::Control::Kind::CREDIT, st.prefetch));
              }
              return;
            }
            case wire::Envelope::PULL_PARAMS: {
              for (outgoing& o : st.core->take_pull(r)) send_to(*st.dir, o.to, std::move(o.msg));
              return;
            }
            default:
              st.core->take(r);
          }
          stage_step(self);
        } catch (const std::exception& e) {
          fail(self, *st.dir, me, st.coordinator, net::to_string(me) + ": " + e.what(), failure_of(e));
        }
      },
  };
}

// --- evaluator ---

struct evaluator_state {
  std::shared_ptr<evaluator_core> core;
  std::shared_ptr<const directory> dir;
  net::address coordinator;
  std::deque<snapshot_request> queued;  // snapshots asked for while one is in progress
};
using evaluator_actor_t = caf::stateful_actor<evaluator_state>;

/// Starts the next queued snapshot when none is in progress; finishes the
/// one in progress when every shard has answered.
void evaluator_advance(evaluator_actor_t* self) {
  auto& st = self->state;
  for (;;) {
    if (!st.core->active()) {
      if (st.queued.empty()) return;
      const snapshot_request req = st.queued.front();
      st.queued.pop_front();
      for (auto& p : st.core->begin(req)) send_to(*st.dir, p.to, std::move(p.msg));
      self->delayed_send(self, snapshot_timeout, timeout_atom::value, req.epoch);
      self->delayed_send(self, snapshot_retry, retry_atom::value, req.epoch);
    }
    if (!st.core->complete()) return;
    const evaluation_result e = st.core->finish();
    send_to(*st.dir, st.coordinator, make_evaluation(st.core->address(), st.coordinator, e));
  }
}

caf::behavior evaluator_actor(evaluator_actor_t* self, std::shared_ptr<evaluator_core> core, net::address coordinator,
                              std::shared_ptr<const directory> dir) {
  auto& st = self->state;
  st.core = std::move(core);
  st.dir = std::move(dir);
  st.coordinator = coordinator;
  return {
      [self](retry_atom, uint32_t epoch) {
        auto& st = self->state;
        if (!st.core->active() || st.core->request().epoch != epoch) return;
        for (auto& p : st.core->retry()) send_to(*st.dir, p.to, std::move(p.msg));
        self->delayed_send(self, snapshot_retry, retry_atom::value, epoch);
      },
      [self](timeout_atom, uint32_t epoch) {
        auto& st = self->state;
        if (st.core->active() && st.core->request().epoch == epoch)
          fail(self, *st.dir, st.core->address(), st.coordinator,
               "evaluator: no Params from " + st.core->missing() + " within " +
                   std::to_string(snapshot_timeout.count()) + " s of the snapshot of epoch " + std::to_string(epoch),
               failure::timeout);
      },
      [self](const net::message& m) {
        auto& st = self->state;
        try {
          const net::envelope_reader r(m, net::peer_limits());  // opened and validated once
          net::require_accepted(wire::Role::EVALUATOR, r, "evaluator");
          switch (r.root().which()) {
            case wire::Envelope::SNAPSHOT:
              st.queued.push_back(read_snapshot(r));
              evaluator_advance(self);
              break;
            case wire::Envelope::PARAMS:
              st.core->on_params(r);
              evaluator_advance(self);
              break;
            case wire::Envelope::CONTROL:
              if (read_control(r).kind == wire::Control::Kind::STOP) self->quit();
              break;
            default:
              break;
          }
        } catch (const std::exception& e) {
          fail(self, *st.dir, st.core->address(), st.coordinator, std::string("evaluator: ") + e.what(), failure_of(e));
        }
      },
  };
}

} // namespace

caf::actor spawn_loader(caf::actor_system& sys, std::shared_ptr<loader_core> core, net::address coordinator,
                        std::shared_ptr<const directory> dir) {
  return sys.spawn(loader_actor, std::move(core), coordinator, std::move(dir));
}

caf::actor spawn_worker(caf::actor_system& sys, std::shared_ptr<worker_core> core, net::address loader,
                        net::address coordinator, int prefetch, std::chrono::milliseconds reply_timeout,
                        std::shared_ptr<const directory> dir) {
  return sys.spawn(worker_actor, std::move(core), loader, coordinator, prefetch, reply_timeout, std::move(dir));
}

caf::actor spawn_shard(caf::actor_system& sys, std::shared_ptr<shard_core> core,
                       std::shared_ptr<const directory> dir, std::ostream* log) {
  return sys.spawn(shard_actor, std::move(core), std::move(dir), log);
}

caf::actor spawn_stage(caf::actor_system& sys, std::shared_ptr<stage_core> core, net::address loader,
                       net::address coordinator, int prefetch, std::shared_ptr<const directory> dir) {
  return sys.spawn(stage_actor, std::move(core), loader, coordinator, prefetch, std::move(dir));
}

caf::actor spawn_evaluator(caf::actor_system& sys, std::shared_ptr<evaluator_core> core, net::address coordinator,
                           std::shared_ptr<const directory> dir) {
  // Detached: an evaluation runs on its own thread, never on a scheduler thread.
  return sys.spawn<caf::detached>(evaluator_actor, std::move(core), coordinator, std::move(dir));
}

} // namespace troupe::actors
