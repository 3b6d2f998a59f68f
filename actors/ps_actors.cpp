// The parameter-server actors on CAF 0.17. Each actor owns one of the cores of
// actors/ps_core.hpp and only moves net::message values: every message between
// actors is a Cap'n Proto Envelope, shared by reference in this process.

#include <caf/all.hpp>

#include <algorithm>
#include <chrono>
#include <deque>
#include <fstream>
#include <memory>
#include <ostream>
#include <sstream>
#include <thread>

#include "actors/async_train.hpp"
#include "actors/ps_actors.hpp"
#include "kernels/kernels.hpp"
#include "model/optimizer.hpp"
#include "net/checkpoint.hpp"
#include "net/tensor_codec.hpp"
#include "tensor/error.hpp"

// A net::message is immutable and shared by reference: safe to pass between
// actors of one process as it is.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::net::message)

namespace troupe::actors {

namespace {

using clock_type = std::chrono::steady_clock;
using release_atom = caf::atom_constant<caf::atom("release")>;
using start_atom = caf::atom_constant<caf::atom("start")>;

using train::seconds_since;

/// The kind of `m`, validated but without scanning payloads (the receiving
/// core validates fully). Throws net::message_error.
wire::Envelope::Which kind_of(const net::message& m) {
  net::reader_limits l;
  l.max_bytes = uint64_t(1) << 30;
  l.check_finite = false;
  return net::envelope_reader(m, l).root().which();
}

struct control_view {
  wire::Control::Kind kind;
  uint32_t amount;
  std::string detail;
};

control_view read_control(const net::message& m) {
  net::envelope_reader r(m);
  auto c = r.root().getControl();
  return {c.getKind(), c.getAmount(), c.getDetail()};
}

// --- data loader ---

caf::behavior loader_actor(caf::event_based_actor* self, std::shared_ptr<loader_core> c) {
  return {
      [self, c](const net::message& m) {
        try {
          if (kind_of(m) != wire::Envelope::CONTROL) return;
          control_view cv = read_control(m);
          if (cv.kind == wire::Control::Kind::STOP) {
            self->quit();
            return;
          }
          if (cv.kind != wire::Control::Kind::CREDIT) return;
          // One batch per credit: at most `prefetch` batches per worker exist at a time.
          auto to = caf::actor_cast<caf::actor>(self->current_sender());
          for (uint32_t i = 0; i < cv.amount; ++i) self->send(to, c->next());
        } catch (const std::exception& e) {
          self->quit(caf::make_error(caf::sec::runtime_error, std::string("data loader: ") + e.what()));
        }
      },
  };
}

// --- worker ---

struct worker_state {
  std::shared_ptr<worker_core> core;
  caf::actor loader, coordinator;
  std::vector<caf::actor> shards;
  std::deque<net::message> batches;
  std::vector<std::pair<uint32_t, net::message>> held;  // pushes delayed by the speed factor
  float speed = 1;
  int prefetch = 2;
  bool busy = false;
};

void fail(caf::event_based_actor* self, const caf::actor& coordinator, uint32_t id, const std::string& why) {
  self->send(coordinator, make_control(id, wire::Control::Kind::ERROR, 0, why));
  self->quit();
}

void worker_send(caf::stateful_actor<worker_state>* self, std::vector<std::pair<uint32_t, net::message>>& pushes) {
  auto& st = self->state;
  for (auto& [shard, m] : pushes) self->send(st.shards.at(shard), std::move(m));
  pushes.clear();
  if (st.core->report_due()) self->send(st.coordinator, make_metrics(st.core->report()));
}

void worker_try_step(caf::stateful_actor<worker_state>* self) {
  auto& st = self->state;
  while (!st.busy && st.core->ready() && !st.batches.empty()) {
    net::message b = std::move(st.batches.front());
    st.batches.pop_front();
    self->send(st.loader, make_control(st.core->id(), wire::Control::Kind::CREDIT, 1));
    const auto t0 = clock_type::now();
    worker_core::step_out out;
    try {
      out = st.core->step(b);
    } catch (const std::exception& e) {
      fail(self, st.coordinator, st.core->id(), "worker " + std::to_string(st.core->id()) + ": " + e.what());
      return;
    }
    if (st.speed > 1.0f) {
      // A device `speed` times slower: hold the result for (speed - 1) x the compute time.
      const double extra = (st.speed - 1.0f) * seconds_since(t0);
      st.busy = true;
      st.held = std::move(out.pushes);
      self->delayed_send(self, std::chrono::microseconds(static_cast<int64_t>(extra * 1e6)), release_atom::value);
      return;
    }
    worker_send(self, out.pushes);
  }
}

caf::behavior worker_actor(caf::stateful_actor<worker_state>* self, std::shared_ptr<worker_core> core,
                           caf::actor loader, std::vector<caf::actor> shards, caf::actor coordinator, float speed,
                           int prefetch) {
  auto& st = self->state;
  st.core = std::move(core);
  st.loader = loader;
  st.shards = std::move(shards);
  st.coordinator = coordinator;
  st.speed = speed;
  st.prefetch = prefetch;
  return {
      [self](start_atom) {
        auto& st = self->state;
        self->send(st.loader, make_control(st.core->id(), wire::Control::Kind::CREDIT, st.prefetch));
        std::vector<net::message> pulls = st.core->pull();
        for (std::size_t s = 0; s < pulls.size(); ++s) self->send(st.shards[s], std::move(pulls[s]));
      },
      [self](release_atom) {
        auto& st = self->state;
        st.busy = false;
        worker_send(self, st.held);
        worker_try_step(self);
      },
      [self](const net::message& m) {
        auto& st = self->state;
        try {
          switch (kind_of(m)) {
            case wire::Envelope::BATCH:
              st.batches.push_back(m);
              break;
            case wire::Envelope::PARAMS:
              st.core->on_params(m);
              if (!st.busy && st.core->report_due()) self->send(st.coordinator, make_metrics(st.core->report()));
              break;
            case wire::Envelope::CONTROL:
              if (read_control(m).kind == wire::Control::Kind::STOP) {
                self->quit();
                return;
              }
              break;
            default:
              break;
          }
        } catch (const net::message_error& e) {
          // A malformed reply cannot be trained on; the worker fails loudly rather than hang.
          fail(self, st.coordinator, st.core->id(), "worker " + std::to_string(st.core->id()) + ": " + e.what());
          return;
        }
        worker_try_step(self);
      },
  };
}

// --- parameter shard ---

struct shard_state {
  std::shared_ptr<shard_core> core;
  std::vector<caf::strong_actor_ptr> workers;  // by worker id, learned from their messages
  uint64_t logged_rejects = 0;
};

caf::behavior shard_actor(caf::stateful_actor<shard_state>* self, std::shared_ptr<shard_core> core, int workers,
                          std::ostream* log) {
  self->state.core = std::move(core);
  self->state.workers.resize(workers);
  return {
      [self, log](const net::message& m) {
        auto& st = self->state;
        auto sender = self->current_sender();
        int64_t hint = -1;
        for (std::size_t i = 0; i < st.workers.size(); ++i)
          if (st.workers[i] && st.workers[i] == sender) hint = static_cast<int64_t>(i);
        try {
          if (kind_of(m) == wire::Envelope::CONTROL && read_control(m).kind == wire::Control::Kind::STOP) {
            self->quit();
            return;
          }
        } catch (const net::message_error&) {
          // Counted by the core below.
        }
        auto replies = st.core->handle(m, hint);
        if (st.core->rejects().total() > st.logged_rejects && log) {
          // First rejection per shard only: a flood of bad messages must not flood the log.
          if (st.logged_rejects == 0) *log << "shard rejected a message: " << st.core->last_error() << std::endl;
          st.logged_rejects = st.core->rejects().total();
        }
        for (auto& [worker, reply] : replies) {
          if (worker == coordinator_id || worker >= st.workers.size()) {
            self->send(caf::actor_cast<caf::actor>(sender), std::move(reply));
            continue;
          }
          if (!st.workers[worker]) st.workers[worker] = sender;  // the first message of a worker is its own
          self->send(caf::actor_cast<caf::actor>(st.workers[worker]), std::move(reply));
        }
      },
  };
}

// --- coordinator ---

struct outcome {
  std::vector<train::epoch_metrics> epochs;
  std::string error;
};

struct coordinator_setup {
  const train::options* o = nullptr;
  const train::run_data* data = nullptr;
  std::ostream* log = nullptr;
  std::shared_ptr<outcome> result;
  std::shared_ptr<hogwild_store> hogwild;  // Hogwild! only
  model::model* eval_net = nullptr;        // owned by run_async, used only here
  const shard_plan* plan = nullptr;
  int first_epoch = 0;
  int64_t first_steps = 0;
  int64_t total_updates = 1;
  int64_t batches_per_epoch = 1;           // over all loaders
};

struct coordinator_state {
  coordinator_setup s;
  std::vector<caf::actor> workers, loaders, shards;
  std::unique_ptr<train::progress_reporter> progress;
  std::ofstream metrics;
  clock_type::time_point start, epoch_start;
  int epoch = 0;                 // 0-based, the epoch in progress
  uint64_t epoch_samples = 0, epoch_reports = 0;
  int64_t steps = 0;             // worker reports (pushes) so far
  double epoch_loss = 0;
  double tau_sum = 0;
  int64_t tau_n = 0, tau_max = 0, epoch_rejected = 0;
  bool evaluating = false, finishing = false, partial = false, done = false;
  int pending = 0;  // shards whose parameters the evaluation still waits for
  std::vector<named_tensor> rule_state;  // gathered for the checkpoint, "shard<s>/<name>"
  std::vector<uint64_t> shard_versions;
  std::vector<uint64_t> worker_samples;  // over the run: how evenly the workers progressed
};

void coordinator_broadcast_stop(caf::stateful_actor<coordinator_state>* self, bool shards_too) {
  auto& st = self->state;
  auto stop = make_control(coordinator_id, wire::Control::Kind::STOP);
  for (auto& w : st.workers) self->send(w, stop);
  for (auto& l : st.loaders) self->send(l, stop);
  if (shards_too)
    for (auto& s : st.shards) self->send(s, stop);
}

void coordinator_abort(caf::stateful_actor<coordinator_state>* self, const std::string& why) {
  auto& st = self->state;
  if (st.done) return;
  st.done = true;
  st.s.result->error = why;
  coordinator_broadcast_stop(self, true);
  self->quit();
}

/// Evaluates the gathered parameters and closes the epoch.
void coordinator_finish_epoch(caf::stateful_actor<coordinator_state>* self) {
  auto& st = self->state;
  const train::options& o = *st.s.o;
  model::model& net = *st.s.eval_net;
  if (st.s.hogwild) {
    auto params = net.parameters();
    for (std::size_t i = 0; i < params.size(); ++i)
      std::copy(st.s.hogwild->params[i].begin(), st.s.hogwild->params[i].end(), params[i]->value.data());
  }
  train::epoch_metrics m;
  m.epoch = st.epoch + 1;
  m.train_s = seconds_since(st.epoch_start);
  m.train_loss = st.epoch_reports ? st.epoch_loss / st.epoch_reports : 0;
  m.samples_per_s = m.train_s > 0 ? st.epoch_samples / m.train_s : 0;
  m.steps = st.s.first_steps + st.steps;
  m.lr = model::scheduled_lr(o.lr, o.lr_schedule, m.steps, st.s.total_updates);
  m.mean_staleness = st.tau_n ? st.tau_sum / st.tau_n : 0;
  m.max_staleness = st.tau_max;
  m.rejected = st.epoch_rejected;
  const kernels::context one_thread = kernels::context::with_threads(1);
  m.threads = one_thread.threads;
  if (o.evaluate)
    m.test_accuracy = train::evaluate(one_thread, net, st.s.data->sets.test, st.s.data->norm, o.batch_size);
  if (!o.checkpoint.empty()) {
    net::checkpoint c;
    c.architecture = net.architecture();
    // Only a finished epoch counts: a run stopped by --max-steps redoes that epoch on resume.
    c.epoch = static_cast<uint32_t>(st.partial ? st.epoch : m.epoch);
    c.step = static_cast<uint64_t>(m.steps);
    c.params = net.state();
    c.optimizer_kind = o.algorithm;
    c.optimizer = std::move(st.rule_state);
    // The shards answer in any order; the file does not depend on it.
    std::sort(c.optimizer.begin(), c.optimizer.end(), [](const named_tensor& a, const named_tensor& b) { return a.name < b.name; });
    c.shard_versions = st.shard_versions;
    net::save_checkpoint(o.checkpoint, c);
  }
  m.wall_s = seconds_since(st.start);
  m.peak_rss_mb = train::peak_rss_mb();
  st.progress->finish_line();
  *st.s.log << train::describe(m, o) << std::endl;
  train::write_metrics(st.metrics, m, o);
  st.s.result->epochs.push_back(m);
  // The next epoch starts now; reports that arrived during the evaluation count for it.
  st.epoch_start = clock_type::now();
  st.epoch_loss = 0;
  st.epoch_samples = st.epoch_reports = 0;
  st.tau_sum = 0;
  st.tau_n = st.tau_max = st.epoch_rejected = 0;
  st.evaluating = false;
  ++st.epoch;
  if (st.finishing) {
    if (!st.worker_samples.empty()) {
      auto [lo, hi] = std::minmax_element(st.worker_samples.begin(), st.worker_samples.end());
      *st.s.log << "samples trained per worker: min " << *lo << " (worker " << lo - st.worker_samples.begin()
                << "), max " << *hi << " (worker " << hi - st.worker_samples.begin() << ")" << std::endl;
    }
    st.done = true;
    coordinator_broadcast_stop(self, true);
    self->quit();
  }
}

void coordinator_end_epoch(caf::stateful_actor<coordinator_state>* self, bool final_epoch) {
  auto& st = self->state;
  st.evaluating = true;
  st.finishing = final_epoch;
  // The last epoch stops the workers first, so the evaluated parameters are the final ones.
  if (final_epoch) coordinator_broadcast_stop(self, false);
  if (st.s.hogwild) {
    coordinator_finish_epoch(self);
    return;
  }
  st.pending = static_cast<int>(st.shards.size());
  st.rule_state.clear();
  st.shard_versions.assign(st.shards.size(), 0);
  const bool with_state = !st.s.o->checkpoint.empty();
  for (std::size_t s = 0; s < st.shards.size(); ++s)
    self->send(st.shards[s], make_pull(coordinator_id, static_cast<uint32_t>(s), with_state));
}

caf::behavior coordinator_actor(caf::stateful_actor<coordinator_state>* self, coordinator_setup setup) {
  auto& st = self->state;
  st.s = std::move(setup);
  st.start = st.epoch_start = clock_type::now();
  st.epoch = st.s.first_epoch;
  st.progress = std::make_unique<train::progress_reporter>(*st.s.log, st.s.o->progress);
  self->set_down_handler([self](caf::down_msg& d) {
    // Workers and loaders stop normally once the last epoch has begun its evaluation.
    if (self->state.done || (self->state.finishing && !d.reason)) return;
    coordinator_abort(self, "an actor of the run stopped unexpectedly: " + self->system().render(d.reason));
  });
  return {
      [self](std::vector<caf::actor> workers, std::vector<caf::actor> loaders, std::vector<caf::actor> shards,
             bool resuming) {
        auto& st = self->state;
        st.workers = std::move(workers);
        st.loaders = std::move(loaders);
        st.shards = std::move(shards);
        st.worker_samples.assign(st.workers.size(), 0);
        try {
          train::open_metrics(*st.s.o, resuming, st.metrics);
        } catch (const std::exception& e) {
          coordinator_abort(self, e.what());
          return;
        }
        for (auto& a : st.workers) self->monitor(a);
        for (auto& a : st.loaders) self->monitor(a);
        for (auto& a : st.shards) self->monitor(a);
        for (auto& w : st.workers) self->send(w, start_atom::value);
      },
      [self](const net::message& m) {
        auto& st = self->state;
        if (st.done) return;
        const train::options& o = *st.s.o;
        try {
          net::envelope_reader r(m);
          switch (r.root().which()) {
            case wire::Envelope::METRICS: {
              if (st.finishing) return;  // steps finished after the stop do not count
              step_report rep = read_metrics(r.root().getMetrics(), r.root().getSender());
              if (rep.worker < st.worker_samples.size()) st.worker_samples[rep.worker] += rep.samples;
              st.epoch_samples += rep.samples;
              ++st.epoch_reports;
              ++st.steps;
              st.epoch_loss += rep.loss;
              st.tau_sum += rep.mean_staleness;
              ++st.tau_n;
              st.tau_max = std::max<int64_t>(st.tau_max, rep.max_staleness);
              st.epoch_rejected += rep.rejected;
              if (o.on_step) o.on_step(st.s.first_steps + st.steps, rep.loss);
              const double per_epoch = static_cast<double>(st.s.data->sets.train.count);
              st.progress->update(st.epoch + 1, o.epochs,
                                  static_cast<int64_t>(st.epoch_samples / o.batch_size), st.s.batches_per_epoch,
                                  st.epoch_loss / st.epoch_reports, st.epoch_samples / seconds_since(st.epoch_start));
              const bool last_step = o.max_steps && st.s.first_steps + st.steps >= o.max_steps;
              const bool epoch_full = st.epoch_samples >= per_epoch;
              if (!st.evaluating && (epoch_full || last_step)) {
                st.partial = !epoch_full;
                coordinator_end_epoch(self, last_step || st.epoch + 1 >= o.epochs);
              }
              break;
            }
            case wire::Envelope::PARAMS: {
              if (!st.evaluating || st.pending == 0) return;
              // The evaluation model takes the shard's tensors in the plan's order.
              auto p = r.root().getParams();
              if (p.getShard() >= static_cast<uint32_t>(st.s.plan->shards)) return;
              std::vector<tensor*> into;
              for (auto* q : st.s.eval_net->parameters()) into.push_back(&q->value);
              const uint32_t s = copy_shard_params(p, *st.s.plan, into);
              st.shard_versions.at(s) = p.getVersion();
              for (auto& t : net::decode(p.getRuleState(), "shard state"))
                st.rule_state.push_back({"shard" + std::to_string(s) + "/" + t.name, std::move(t.value)});
              if (--st.pending == 0) coordinator_finish_epoch(self);
              break;
            }
            case wire::Envelope::CONTROL: {
              auto c = r.root().getControl();
              if (c.getKind() == wire::Control::Kind::ERROR) coordinator_abort(self, c.getDetail());
              break;
            }
            default:
              break;
          }
        } catch (const std::exception& e) {
          coordinator_abort(self, std::string("coordinator: ") + e.what());
        }
      },
  };
}

} // namespace

caf::actor spawn_shard(caf::actor_system& sys, std::shared_ptr<shard_core> core, int workers, std::ostream* log) {
  return sys.spawn(shard_actor, std::move(core), workers, log);
}

std::vector<train::epoch_metrics> run_async(const train::options& o, std::ostream& log) {
  train::validate(o);
  if (o.algorithm == "sequential") throw error("run_async: --algorithm sequential runs in train::run");
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = o.threads > 0 ? o.threads : cores;
  const int per_worker = std::max(1, threads / o.workers);
  // Scheduler threads beyond the workers' kernel threads only steal cores from
  // them (idle CAF threads poll): one worker with 2 kernel threads gets 1 scheduler thread.
  const int caf_threads = std::max(1, std::min(threads, o.workers));
  const bool hogwild = o.algorithm == "hogwild";
  const bool resuming = train::resumes(o);
  // This thread only sets up and waits; the kernels run on the scheduler's
  // threads. A kernel thread team started here would stay, and with more
  // OpenMP threads than cores libgomp stops spinning between parallel regions:
  // every region of the workers' teams then waits for a woken thread. Nothing
  // here runs kernels in a context of more than one thread.

  train::run_data data = train::load_data(o, log);
  const data::image_dataset& train_set = data.sets.train;
  if (train_set.count < o.workers)
    throw error("--workers " + std::to_string(o.workers) + " exceeds the " + std::to_string(train_set.count) +
                " training images");
  auto fresh_model = [&] { return train::build_model(o, train_set); };
  model::model eval_net = fresh_model();
  int first_epoch = 0;
  int64_t first_steps = 0;
  net::checkpoint c;
  if (resuming) {
    c = net::load_checkpoint(o.checkpoint);
    eval_net.load_state(c.architecture, c.params);
    first_epoch = static_cast<int>(c.epoch);
    first_steps = static_cast<int64_t>(c.step);
    log << "resumed from " << o.checkpoint << " after epoch " << first_epoch << "\n";
  }
  if (first_epoch >= o.epochs) return {};
  auto params = eval_net.parameters();
  std::vector<int64_t> sizes;
  for (auto* p : params) sizes.push_back(p->value.numel());
  shard_plan plan = hogwild ? shard_plan{} : plan_shards(sizes, o.shards);

  // Loaders: worker i trains on its own shard of the training set.
  std::vector<std::shared_ptr<loader_core>> loader_cores;
  int64_t batches_per_epoch = 0;
  for (int i = 0; i < o.workers; ++i) {
    const int64_t begin = train_set.count * i / o.workers, end = train_set.count * (i + 1) / o.workers;
    loader_cores.push_back(std::make_shared<loader_core>(train_set, data.norm, o.batch_size,
                                                         o.seed + 1000003ull * i, begin, end, i, first_epoch));
    batches_per_epoch += loader_cores.back()->batches_per_epoch();
  }
  int64_t total_updates = batches_per_epoch * o.epochs / o.push_every;
  if (o.algorithm == "ssgd") total_updates /= o.workers;
  total_updates = std::max<int64_t>(1, total_updates);

  auto hw = hogwild ? std::make_shared<hogwild_store>() : nullptr;
  if (hw)
    for (auto* p : params) hw->params.emplace_back(p->value.data(), p->value.data() + p->value.numel());

  auto result = std::make_shared<outcome>();
  log << "model " << o.model << ": " << eval_net.num_parameters() << " parameters; " << o.algorithm << " with "
      << o.workers << " worker(s), " << (hogwild ? std::string("one shared buffer") : std::to_string(o.shards) + " shard(s)")
      << ", push every " << o.push_every << ", " << per_worker << " thread(s) per worker\n";
  {
    caf::actor_system_config cfg;
    cfg.set("scheduler.max-threads", static_cast<size_t>(caf_threads));
    cfg.set("logger.verbosity", caf::atom("quiet"));
    // Several workers need one shared FIFO run queue: work stealing resumes the
    // actor woken last first, which starved workers completely (0 samples for one
    // of 16 CNN workers). A single worker keeps work stealing: twice the throughput.
    if (o.workers > 1) cfg.set("scheduler.policy", caf::atom("sharing"));
    caf::actor_system sys{cfg};

    coordinator_setup cs;
    cs.o = &o;
    cs.data = &data;
    cs.log = &log;
    cs.result = result;
    cs.hogwild = hw;
    cs.eval_net = &eval_net;
    cs.plan = &plan;
    cs.first_epoch = first_epoch;
    cs.first_steps = first_steps;
    cs.total_updates = total_updates;
    cs.batches_per_epoch = batches_per_epoch;
    auto coordinator = sys.spawn(coordinator_actor, cs);

    std::vector<caf::actor> shards, loaders, workers;
    if (!hogwild) {
      model::update_config rc = o.rule;
      rc.rule = o.algorithm;
      rc.lr = o.lr;
      rc.workers = o.workers;
      for (int s = 0; s < plan.shards; ++s) {
        std::vector<named_tensor> mine;
        for (int i : plan.members[s]) mine.push_back({params[i]->name, params[i]->value.clone()});
        // The shard runs on the scheduler's threads, as many kernel threads as a worker.
        auto core = std::make_shared<shard_core>(static_cast<uint32_t>(s), std::move(mine), rc, o.lr_schedule,
                                                 total_updates, net::reader_limits{},
                                                 kernels::context::with_threads(per_worker));
        if (resuming) resume_shard(*core, c, o.algorithm, plan.shards, log);
        shards.push_back(spawn_shard(sys, core, o.workers, &log));
      }
    }
    // Workers borrow replicas for their steps: as many exist as steps run at once.
    auto replicas = std::make_shared<replica_pool>(fresh_model);
    for (int i = 0; i < o.workers; ++i) {
      loaders.push_back(sys.spawn(loader_actor, loader_cores[i]));
      worker_config wc;
      wc.id = static_cast<uint32_t>(i);
      wc.push_every = o.push_every;
      wc.worker_lr = o.worker_lr > 0 ? o.worker_lr : o.lr;
      wc.worker_momentum = o.worker_momentum;
      wc.threads = per_worker;
      wc.hogwild = hw.get();
      wc.lr = o.lr;
      wc.lr_schedule = o.lr_schedule;
      wc.total_updates = total_updates;
      auto core = std::make_shared<worker_core>(replicas, plan, wc);
      const float speed = o.speeds.empty() ? 1.0f : o.speeds[i];
      workers.push_back(sys.spawn(worker_actor, core, loaders.back(), shards, coordinator, speed, o.prefetch));
    }
    caf::scoped_actor self{sys};
    self->monitor(coordinator);
    self->send(coordinator, workers, loaders, shards, resuming);
    self->receive([](const caf::down_msg&) {});
    for (auto& a : workers) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    for (auto& a : loaders) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    for (auto& a : shards) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }  // the actor system waits for every actor here
  if (!result->error.empty()) throw error(result->error);
  return result->epochs;
}

std::vector<train::epoch_metrics> run_any(const train::options& o, std::ostream& log) {
  return o.algorithm == "sequential" ? train::run(o, log) : run_async(o, log);
}

} // namespace troupe::actors
