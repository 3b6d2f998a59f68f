// The role actors on CAF's test coordinator (tests/actors/caf_testing.hpp):
// each message runs when the test says, and time moves only by the test
// clock, so that timeouts (a join's, a retry's, a device's hold) are tested
// without sleeping and every run is the same. Roles not under test are
// recorders in the directory; other nodes are senders that keep what they
// are given.
#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "actors/allreduce.hpp"
#include "actors/messages.hpp"
#include "actors/roles.hpp"
#include "model/nn.hpp"
#include "net/tensor_codec.hpp"
#include "tests/actors/caf_testing.hpp"
#include "tests/actors/ps_messages.hpp"

using namespace troupe;
using namespace troupe::testing;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;
using kind = wire::Control::Kind;

namespace {

net::address node_addr(uint32_t n) { return {n, net::role::node, 0}; }
net::address stage_addr(uint32_t k) { return {0, net::role::stage, k}; }

/// A directory whose local addresses `locals` are served by `rec` and whose
/// nodes `remote_nodes` are senders keeping what they are given in `remote`.
std::shared_ptr<actors::directory> make_directory(const caf::actor& rec, const std::vector<net::address>& locals,
                                                  const std::vector<uint32_t>& remote_nodes,
                                                  const std::shared_ptr<recorded>& remote) {
  auto dir = std::make_shared<actors::directory>();
  for (const auto& a : locals) dir->add(a, rec);
  for (uint32_t n : remote_nodes)
    dir->add_remote(n, [remote](const net::address&, const net::message& m, int) { remote->messages.push_back(m); });
  return dir;
}

// --- the coordinator ---

/// Where the roles of a coordinator's run are: the nodes by name (the
/// coordinator and the evaluator on node 0), worker i and its loader on node
/// worker_nodes[i], one shard.
struct layout_of_run {
  std::vector<std::string> names{"local"};
  std::vector<uint32_t> worker_nodes{0};
  uint32_t shard_node = 0;
  int64_t samples_per_epoch = 8;  ///< 4 reports of batch_size 2
  double join_timeout_s = 60;
};
constexpr int64_t batch_size = 2;

/// A job of `epochs` epochs of batches of 2 with `algo`, nothing printed.
troupe::job job_of(const troupe::algorithm& algo, int epochs = 2) {
  return troupe::job().algorithm(algo).epochs(epochs).batch_size(batch_size).progress(progress_mode::none);
}

train::plan plan_of(const layout_of_run& l) {
  train::plan p;
  p.coordinator = coordinator_addr();
  p.evaluator = evaluator_addr();
  for (uint32_t i = 0; i < l.worker_nodes.size(); ++i) {
    const uint32_t n = l.worker_nodes[i];
    p.loaders.push_back({loader_addr(i, n), worker_addr(i, n), 0, 0, 0});
    train::worker_plan w;
    w.address = worker_addr(i, n);
    w.loader = loader_addr(i, n);
    p.workers.push_back(w);
  }
  p.shards.push_back(shard_plan_of(0, 0, 1, 0, 1, 0));
  p.shards[0].address = shard_addr(0, l.shard_node);
  for (const train::worker_plan& w : p.workers) p.shards[0].clients.push_back(w.address);
  p.samples_per_epoch = l.samples_per_epoch;
  p.batches_per_epoch = l.samples_per_epoch / batch_size;
  p.total_updates = 100;
  return p;
}

/// A coordinator on node 0: the roles of node 0 are recorded by `seen`, what goes to other nodes by `remote`.
struct coordinator_run {
  std::ostringstream log;  // outlives the actor system
  std::shared_ptr<recorded> seen = std::make_shared<recorded>();
  std::shared_ptr<recorded> watched = std::make_shared<recorded>();
  std::shared_ptr<recorded> remote = std::make_shared<recorded>();  // sent to other nodes
  std::shared_ptr<actors::outcome> result = std::make_shared<actors::outcome>();
  train::plan plan;
  std::shared_ptr<actors::directory> dir;
  caf_testing t;
  caf::actor local_roles;  // the recorder serving node 0's roles
  caf::actor coordinator;

  coordinator_run(const troupe::job& job, const layout_of_run& l) : plan(plan_of(l)) {
    std::vector<net::address> locals{plan.evaluator, node_addr(0)};
    if (l.shard_node == 0) locals.push_back(plan.shards[0].address);
    for (std::size_t i = 0; i < l.worker_nodes.size(); ++i)
      if (l.worker_nodes[i] == 0) {
        locals.push_back(plan.workers[i].address);
        locals.push_back(plan.loaders[i].address);
      }
    std::vector<uint32_t> others;
    for (uint32_t n = 1; n < l.names.size(); ++n) others.push_back(n);
    local_roles = t.recorder(seen);
    dir = make_directory(local_roles, locals, others, remote);
    actors::coordinator_setup s;
    s.job = std::make_shared<troupe::job>(job);
    s.plan = plan;
    s.node_names = l.names;
    s.join_timeout_s = l.join_timeout_s;
    s.log = &log;
    s.result = result;
    coordinator = t.keep(actors::spawn_coordinator(t.sys(), std::move(s), dir));
    dir->add(plan.coordinator, coordinator);
    caf::anon_send(t.recorder(watched), watch_atom::value, coordinator);
    t.run();
  }

  void send(const net::message& m) {
    actors::send_to(*dir, plan.coordinator, m);
    t.run();
  }
  void join(uint32_t node) { send(actors::make_control(node_addr(node), plan.coordinator, kind::JOIN)); }
  /// A report of one step of `samples` samples from worker `w` (an allreduce's: applied in group `group`).
  void report(uint32_t w, double loss, uint64_t samples = 2, uint64_t group = 0) {
    train::step_report r;
    r.step = 1;
    r.loss = loss;
    r.samples = samples;
    r.group = group;
    send(actors::make_metrics(plan.workers[w].address, plan.coordinator, r));
  }
  void evaluated(uint32_t epoch, double accuracy) {
    actors::evaluation_result e;
    e.epoch = epoch;
    e.test_accuracy = accuracy;
    send(actors::make_evaluation(plan.evaluator, plan.coordinator, e));
  }
  std::vector<actors::snapshot_request> snapshots() const {
    std::vector<actors::snapshot_request> out;
    for (const auto& m : seen->to(plan.evaluator, wire::Envelope::SNAPSHOT))
      out.push_back(actors::read_snapshot(net::envelope_reader(m)));
    return out;
  }
  bool ended() const { return watched->saw_down_of(coordinator); }
};

TEST_CASE("coordinator: a role's Control error ends the run with the role's failure type", "[deterministic][actors]") {
  coordinator_run c(job_of(troupe::asgd().workers(1)), {});
  c.join(0);
  // Every node (this one) joined: its loaders and workers are started.
  CHECK(c.seen->controls(node_addr(0), kind::START).size() == 1);
  CHECK(c.seen->controls(worker_addr(0), kind::START).size() == 1);
  CHECK(c.seen->controls(loader_addr(0), kind::START).size() == 1);
  REQUIRE_FALSE(c.ended());

  c.send(actors::make_control(shard_addr(0), c.plan.coordinator, kind::ERROR,
                              static_cast<uint32_t>(failure::diverged), "shard 0 on node 0: the loss diverged"));
  CHECK(c.result->error == "shard 0 on node 0: the loss diverged");
  CHECK(c.result->kind == failure::diverged);
  // Every role is stopped, and the coordinator (its node's last) ends.
  for (const net::address& a : {worker_addr(0), loader_addr(0), shard_addr(0), evaluator_addr()}) {
    INFO(net::to_string(a));
    CHECK(c.seen->controls(a, kind::STOP).size() == 1);
  }
  CHECK(c.ended());
  CHECK(c.result->epochs.empty());
}

TEST_CASE("coordinator: epochs and steps are counted from the workers' reports", "[deterministic][actors]") {
  // 8 samples an epoch, 2 epochs, batches of 2: four reports of 2 samples close an epoch.
  coordinator_run c(job_of(troupe::asgd().workers(2)), {{"local"}, {0, 0}});
  c.join(0);
  c.report(0, 1.0);
  c.report(1, 2.0);
  c.report(0, 3.0);
  CHECK(c.snapshots().empty());
  c.report(0, 4.0);
  REQUIRE(c.snapshots().size() == 1);
  CHECK(c.snapshots()[0].epoch == 1);
  CHECK(c.snapshots()[0].steps == 4);
  CHECK(c.snapshots()[0].epochs_done == 1);
  CHECK(c.snapshots()[0].epoch_samples == 0);  // a complete epoch
  CHECK(c.result->epochs.empty());             // recorded once evaluated

  c.evaluated(1, 0.5);
  REQUIRE(c.result->epochs.size() == 1);
  CHECK(c.result->epochs[0].epoch == 1);
  CHECK(c.result->epochs[0].steps == 4);
  CHECK(c.result->epochs[0].train_loss == Approx(2.5));
  CHECK(c.result->epochs[0].test_accuracy == 0.5);
  CHECK(c.seen->controls(worker_addr(0), kind::STOP).empty());

  // The last epoch: its fourth report stops the workers and loaders before the snapshot.
  c.report(1, 1.0);
  c.report(0, 1.0);
  c.report(1, 1.0);
  CHECK(c.seen->controls(worker_addr(1), kind::STOP).empty());
  c.report(0, 1.0);
  for (const net::address& a : {worker_addr(0), worker_addr(1), loader_addr(0), loader_addr(1)}) {
    INFO(net::to_string(a));
    CHECK(c.seen->controls(a, kind::STOP).size() == 1);
  }
  REQUIRE(c.snapshots().size() == 2);
  CHECK(c.snapshots()[1].epoch == 2);
  CHECK(c.snapshots()[1].steps == 8);
  c.report(1, 1.0);  // a step finished after the stop does not count
  CHECK_FALSE(c.ended());

  c.evaluated(2, 0.75);
  REQUIRE(c.result->epochs.size() == 2);
  CHECK(c.result->epochs[1].epoch == 2);
  CHECK(c.result->epochs[1].steps == 8);
  CHECK(c.result->epochs[1].train_loss == Approx(1.0));
  CHECK(c.result->error.empty());
  CHECK_THAT(c.log.str(), Contains("samples trained per worker: min 6 (worker 1), max 10 (worker 0)"));
  CHECK(c.seen->controls(shard_addr(0), kind::STOP).size() == 1);
  CHECK(c.ended());
}

TEST_CASE("coordinator: an asynchronous run goes on without a lost worker node", "[deterministic][actors]") {
  // Node a: the coordinator and the shard; b and c: a worker each. Epochs of 4 samples.
  coordinator_run c(job_of(troupe::asgd().workers(2)), {{"a", "b", "c"}, {1, 2}, 0, 4});
  c.join(0);
  c.join(1);
  CHECK(c.remote->controls(worker_addr(0, 1), kind::START).empty());  // not before every node joined
  c.join(2);
  CHECK(c.remote->controls(worker_addr(0, 1), kind::START).size() == 1);
  CHECK(c.remote->controls(worker_addr(1, 2), kind::START).size() == 1);

  c.send(actors::make_control(node_addr(0), c.plan.coordinator, kind::LOST, 2, "no frame for 3 s"));
  CHECK(c.result->error.empty());
  CHECK_FALSE(c.ended());
  CHECK_THAT(c.log.str(), Contains("node c was lost (no frame for 3 s): training goes on with 1 of 2 workers"));
  // Node c learns it was dropped (it joins again by itself when it comes back).
  const auto dropped = c.remote->controls(node_addr(2), kind::LOST);
  REQUIRE(dropped.size() == 1);
  CHECK(control_of(dropped[0]).second == 2u);
  CHECK(c.remote->controls(worker_addr(0, 1), kind::STOP).empty());

  // Worker 0 alone trains the epoch; its record counts the lost worker.
  c.report(0, 1.0);
  c.report(0, 3.0);
  REQUIRE(c.snapshots().size() == 1);
  c.evaluated(1, 0.5);
  REQUIRE(c.result->epochs.size() == 1);
  CHECK(c.result->epochs[0].steps == 2);
  CHECK(c.result->epochs[0].lost_workers == 1);
}

TEST_CASE("coordinator: an allreduce's records count its regroups and leave out the reports of a replaced group",
          "[deterministic][actors]") {
  // Node a: the coordinator; b and c: a worker each. Epochs of 8 samples.
  coordinator_run c(job_of(troupe::allreduce().workers(2)), {{"a", "b", "c"}, {1, 2}, 0, 8});
  for (uint32_t n = 0; n < 3; ++n) c.join(n);
  c.report(0, 1.0);  // group 0's first step, from both workers
  c.report(1, 1.0);
  c.send(actors::make_control(node_addr(0), c.plan.coordinator, kind::LOST, 2, "no frame for 3 s"));
  // Worker 0 is held, reports the step it applied, and the group goes on without worker 1.
  const auto holds = c.remote->to(worker_addr(0, 1), wire::Envelope::REGROUP);
  REQUIRE(holds.size() == 1);
  const actors::regroup hold = actors::read_regroup(net::envelope_reader(holds[0]));
  CHECK(hold.phase == actors::regroup::hold);
  actors::regroup rep;
  rep.epoch = hold.epoch;
  rep.phase = actors::regroup::report;
  rep.step = 1;
  c.send(actors::make_regroup(worker_addr(0, 1), c.plan.coordinator, rep));
  const auto gos = c.remote->to(worker_addr(0, 1), wire::Envelope::REGROUP);
  REQUIRE(gos.size() == 2);
  const actors::regroup go = actors::read_regroup(net::envelope_reader(gos[1]));
  CHECK(go.phase == actors::regroup::go);
  CHECK(go.reports == 2);
  // A step of the old group (undone by the regroup) is left out; the new group's count.
  c.report(0, 100.0, 2, 0);
  c.report(0, 3.0, 2, go.epoch);
  CHECK(c.snapshots().empty());
  c.report(0, 3.0, 2, go.epoch);
  REQUIRE(c.snapshots().size() == 1);
  c.evaluated(1, 0.5);
  REQUIRE(c.result->epochs.size() == 1);
  const epoch_metrics& e = c.result->epochs[0];
  CHECK(e.steps == 4);
  CHECK(e.train_loss == Approx(2.0));
  CHECK(e.lost_workers == 1);
  CHECK(e.regroups == 1);
  CHECK(e.dropped_reports == 1);
  train::run_info info;
  info.algorithm = "allreduce";
  info.collective = true;
  CHECK_THAT(train::to_json(e, info), Contains("\"lost_workers\":1,\"regroups\":1,\"dropped_reports\":1"));
  info.collective = false;
  CHECK_THAT(train::to_json(e, info), !Contains("regroups"));
}

TEST_CASE("coordinator: SSGD stops with a lost-node failure when a worker node is lost", "[deterministic][actors]") {
  coordinator_run c(job_of(troupe::ssgd().workers(2)), {{"a", "b", "c"}, {1, 2}, 0, 4});
  for (uint32_t n = 0; n < 3; ++n) c.join(n);
  c.send(actors::make_control(node_addr(0), c.plan.coordinator, kind::LOST, 2, "no frame for 3 s"));
  CHECK_THAT(c.result->error, Contains("node c was lost (no frame for 3 s): ssgd waits for every worker"));
  CHECK(c.result->kind == failure::lost_node);
  CHECK(c.seen->controls(shard_addr(0), kind::STOP).size() == 1);
  CHECK(c.remote->controls(worker_addr(0, 1), kind::STOP).size() == 1);
  // It waits for node b (still up) to say its actors stopped, then ends.
  CHECK_FALSE(c.ended());
  c.send(actors::make_control(node_addr(1), c.plan.coordinator, kind::STOPPED));
  CHECK(c.ended());
}

TEST_CASE("coordinator: a node that has not joined within the join timeout fails the run, named",
          "[deterministic][actors]") {
  coordinator_run c(job_of(troupe::asgd().workers(2)), {{"a", "b"}, {0, 1}, 0, 8, 5.0});
  c.join(0);
  c.t.advance(4900ms);
  CHECK(c.result->error.empty());
  CHECK_FALSE(c.ended());
  c.t.advance(100ms);
  CHECK_THAT(c.result->error, Contains("node(s) b did not join within 5 s: b: no connection came"));
  CHECK(c.result->kind == failure::timeout);
  CHECK(c.ended());
  CHECK(c.seen->controls(worker_addr(0), kind::START).empty());  // training never started
}

TEST_CASE("coordinator: a worker node that has not reported after its start is started again",
          "[deterministic][actors]") {
  coordinator_run c(job_of(troupe::asgd().workers(2)), {{"a", "b"}, {0, 1}});
  c.join(0);
  c.join(1);
  CHECK(c.remote->controls(worker_addr(1, 1), kind::START).size() == 1);
  c.report(0, 1.0);  // node a's worker reported, node b's did not
  c.t.advance(1999ms);
  CHECK(c.remote->controls(worker_addr(1, 1), kind::START).size() == 1);
  c.t.advance(1ms);
  CHECK(c.remote->controls(worker_addr(1, 1), kind::START).size() == 2);
  CHECK(c.remote->controls(loader_addr(1, 1), kind::START).size() == 2);
  CHECK(c.seen->controls(worker_addr(0), kind::START).size() == 1);  // node a is not started again
  c.report(1, 1.0);
  c.t.advance(10s);
  CHECK(c.remote->controls(worker_addr(1, 1), kind::START).size() == 2);  // it reported: no more starts
}

TEST_CASE("coordinator: a lost worker node that joins again gets its work back", "[deterministic][actors]") {
  coordinator_run c(job_of(troupe::asgd().workers(2)), {{"a", "b", "c"}, {1, 2}, 0, 4});
  for (uint32_t n = 0; n < 3; ++n) c.join(n);
  c.send(actors::make_control(node_addr(0), c.plan.coordinator, kind::LOST, 2, "no frame for 3 s"));
  REQUIRE(c.remote->controls(worker_addr(1, 2), kind::START).size() == 1);
  c.join(2);
  CHECK_THAT(c.log.str(), Contains("node c joined again: its workers go on from the current parameters"));
  CHECK(c.remote->controls(worker_addr(1, 2), kind::START).size() == 2);
  CHECK(c.remote->controls(loader_addr(1, 2), kind::START).size() == 2);
  CHECK(c.remote->controls(node_addr(2), kind::START).size() == 2);  // each join is answered
  CHECK(c.remote->controls(worker_addr(0, 1), kind::START).size() == 1);  // node b was never lost
  c.report(0, 1.0);
  c.report(1, 1.0);
  c.evaluated(1, 0.5);
  REQUIRE(c.result->epochs.size() == 1);
  CHECK(c.result->epochs[0].lost_workers == 0);
  CHECK(c.result->error.empty());
}

TEST_CASE("coordinator: losing a shard's node stops the run with a lost-node failure naming the shard",
          "[deterministic][actors]") {
  coordinator_run c(job_of(troupe::asgd().workers(2)), {{"a", "b", "c"}, {0, 2}, 1});
  for (uint32_t n = 0; n < 3; ++n) c.join(n);
  c.send(actors::make_control(node_addr(0), c.plan.coordinator, kind::LOST, 1, "no frame for 3 s"));
  CHECK_THAT(c.result->error, Contains("node b was lost (no frame for 3 s); it held parameter shard(s) 0. The job "
                                       "writes no checkpoint (--checkpoint): it must start over."));
  CHECK(c.result->kind == failure::lost_node);
  CHECK(c.seen->controls(worker_addr(0), kind::STOP).size() == 1);
  CHECK(c.remote->controls(worker_addr(1, 2), kind::STOP).size() == 1);
}

TEST_CASE("coordinator: a step callback's stop ends the run with a partial epoch", "[deterministic][actors]") {
  troupe::job j = job_of(troupe::asgd().workers(1));
  std::vector<int64_t> steps;
  j.on_step([&steps](const step_event& e) {
    steps.push_back(e.step);
    if (e.step == 3) e.stop();
  });
  coordinator_run c(j, {});
  c.join(0);
  for (int i = 0; i < 3; ++i) c.report(0, 1.0);
  CHECK(steps == std::vector<int64_t>{1, 2, 3});
  CHECK(c.seen->controls(worker_addr(0), kind::STOP).size() == 1);
  REQUIRE(c.snapshots().size() == 1);
  // 6 of the epoch's 8 samples: a resumed run trains the rest of epoch 1.
  CHECK(c.snapshots()[0].epoch == 1);
  CHECK(c.snapshots()[0].epochs_done == 0);
  CHECK(c.snapshots()[0].epoch_samples == 6);
  CHECK(c.snapshots()[0].steps == 3);
  c.evaluated(1, 0.5);
  REQUIRE(c.result->epochs.size() == 1);
  CHECK(c.result->epochs[0].steps == 3);
  CHECK(c.ended());
  CHECK(c.result->error.empty());
}

TEST_CASE("coordinator: a role actor that stops unexpectedly fails the run", "[deterministic][actors]") {
  coordinator_run c(job_of(troupe::asgd().workers(1)), {});
  c.join(0);
  caf::anon_send_exit(c.local_roles, caf::exit_reason::user_shutdown);
  c.t.run();
  CHECK_THAT(c.result->error, Contains("an actor of the run stopped unexpectedly"));
  CHECK(c.result->kind == failure::other);
  CHECK(c.ended());
}

TEST_CASE("coordinator: a run without progress for 300 s fails with a timeout", "[deterministic][actors]") {
  coordinator_run c(job_of(troupe::asgd().workers(1)), {});
  c.join(0);
  // The watchdog looks every 10 s; a report is progress.
  for (int i = 0; i < 29; ++i) c.t.advance(10s);
  c.report(0, 1.0);
  for (int i = 0; i < 30; ++i) c.t.advance(10s);
  CHECK(c.result->error.empty());  // 300 s since the report: not more
  CHECK_FALSE(c.ended());
  c.t.advance(10s);
  CHECK(c.result->error == "no progress for 300 s: no worker reported a step");
  CHECK(c.result->kind == failure::timeout);
  CHECK(c.seen->controls(worker_addr(0), kind::STOP).size() == 1);
  CHECK(c.ended());
}

TEST_CASE("coordinator: a snapshot the evaluator never answers ends the run after 300 s, named",
          "[deterministic][actors]") {
  coordinator_run c(job_of(troupe::asgd().workers(1), 1), {});
  c.join(0);
  for (int i = 0; i < 4; ++i) c.report(0, 1.0);  // the run's one epoch: the workers stop, a snapshot is asked for
  REQUIRE(c.snapshots().size() == 1);
  for (int i = 0; i < 30; ++i) c.t.advance(10s);
  CHECK(c.result->error.empty());
  c.t.advance(10s);
  CHECK(c.result->error == "no progress for 300 s: no worker reported a step and the evaluator did not answer");
  CHECK(c.result->kind == failure::timeout);
  CHECK(c.result->epochs.empty());
}

// --- the node actor ---

/// Node `self` of `names` (the coordinator on node 0): its role actors are
/// recorders, the coordinator's node a remote sender (or, on node 0, a recorder).
struct node_run {
  std::ostringstream log;
  std::shared_ptr<recorded> roles = std::make_shared<recorded>();
  std::shared_ptr<recorded> watched = std::make_shared<recorded>();
  std::shared_ptr<recorded> remote = std::make_shared<recorded>();  // sent to other nodes
  std::shared_ptr<actors::outcome> result = std::make_shared<actors::outcome>();
  std::shared_ptr<actors::directory> dir;
  caf_testing t;
  std::vector<caf::actor> locals;
  caf::actor node;
  uint32_t self;

  node_run(uint32_t self_, std::vector<std::string> names, double join_timeout_s = 60, int role_actors = 2)
      : self(self_) {
    std::vector<uint32_t> others;
    for (uint32_t n = 0; n < names.size(); ++n)
      if (n != self) others.push_back(n);
    dir = make_directory(caf::actor{}, {}, others, remote);
    actors::node_setup s;
    s.self = self;
    s.node_names = std::move(names);
    s.coordinator = coordinator_addr();
    s.join_timeout_s = join_timeout_s;
    for (int i = 0; i < role_actors; ++i) locals.push_back(t.recorder(roles));
    s.locals = locals;
    s.result = result;
    s.log = &log;
    node = t.keep(actors::spawn_node_actor(t.sys(), std::move(s), dir));
    dir->add(node_addr(self), node);
    auto w = t.recorder(watched);
    caf::anon_send(w, watch_atom::value, node);
    for (const auto& l : locals) caf::anon_send(w, watch_atom::value, l);
    t.run();
  }
  template <class... Ts>
  void tell(Ts&&... xs) {
    caf::anon_send(node, std::forward<Ts>(xs)...);
    t.run();
  }
  void peer_up(uint32_t n) { tell(actors::peer_up_atom::value, n); }
  void from_coordinator(kind k, uint32_t amount = 0, const std::string& detail = {}) {
    const net::address me = node_addr(self);
    actors::send_to(*dir, me, actors::make_control(coordinator_addr(), me, k, amount, detail));
    t.run();
  }
  std::size_t joins() const { return remote->controls(coordinator_addr(), kind::JOIN).size(); }
  bool ended() const { return watched->saw_down_of(node); }
};

TEST_CASE("node actor: joins once every link is up, and sends the join again until answered",
          "[deterministic][actors]") {
  node_run n(1, {"a", "b", "c"});
  n.tell(actors::node_start_atom::value);
  n.peer_up(0);
  CHECK(n.joins() == 0);  // node c's link is not up yet
  n.peer_up(2);
  REQUIRE(n.joins() == 1);
  CHECK(net::read_header(n.remote->messages.back()).source == node_addr(1));
  n.t.advance(1999ms);
  CHECK(n.joins() == 1);
  n.t.advance(1ms);  // no answer within 2 s: the join may have been lost
  CHECK(n.joins() == 2);
  n.from_coordinator(kind::START);  // the coordinator's answer
  n.t.advance(2s);
  CHECK(n.joins() == 2);
  n.t.advance(60s);  // the join timeout passes harmlessly
  CHECK(n.result->error.empty());
  CHECK_FALSE(n.ended());
}

TEST_CASE("node actor: without a link to every node by the join timeout it fails, naming the node missing",
          "[deterministic][actors]") {
  node_run n(1, {"a", "b", "c"}, 5.0);
  n.tell(actors::node_start_atom::value);
  n.peer_up(0);
  n.t.advance(5s);
  // Its link to the coordinator's node is up: it waits a little for the coordinator's verdict.
  CHECK(n.result->error.empty());
  CHECK_FALSE(n.ended());
  n.t.advance(10s);
  CHECK_THAT(n.result->error, Contains("node b: no link to node(s) c within 5 s: c: no connection came"));
  CHECK(n.result->kind == failure::timeout);
  CHECK(n.roles->exits.size() == 2);  // its role actors are stopped
  CHECK(n.ended());
  CHECK(n.joins() == 0);
}

TEST_CASE("node actor: dropped by the coordinator it joins again, and fails if not taken back in time",
          "[deterministic][actors]") {
  node_run n(1, {"a", "b"}, 5.0);
  n.tell(actors::node_start_atom::value);
  n.peer_up(0);
  REQUIRE(n.joins() == 1);
  n.from_coordinator(kind::START);
  n.from_coordinator(kind::LOST, 0, "about another node");  // not this node: nothing happens
  CHECK(n.joins() == 1);
  n.from_coordinator(kind::LOST, 1, "no frame for 3 s");
  CHECK(n.joins() == 2);
  CHECK_THAT(n.log.str(), Contains("the coordinator dropped this node (no frame for 3 s)"));
  n.t.advance(5s);
  CHECK_THAT(n.result->error, Contains("could not join the run again within 5 s"));
  CHECK(n.result->kind == failure::lost_node);
  CHECK(n.ended());
}

TEST_CASE("node actor: when all its role actors have stopped it tells the coordinator and ends",
          "[deterministic][actors]") {
  node_run n(1, {"a", "b"});
  n.tell(actors::node_start_atom::value);
  n.peer_up(0);
  n.from_coordinator(kind::START);
  caf::anon_send_exit(n.locals[0], caf::exit_reason::user_shutdown);
  n.t.run();
  CHECK(n.remote->controls(coordinator_addr(), kind::STOPPED).empty());
  CHECK_FALSE(n.ended());
  caf::anon_send_exit(n.locals[1], caf::exit_reason::user_shutdown);
  n.t.run();
  CHECK(n.remote->controls(coordinator_addr(), kind::STOPPED).size() == 1);
  CHECK(n.ended());
  CHECK(n.result->error.empty());
}

TEST_CASE("node actor: the coordinator node's goodbye stops its role actors and ends it", "[deterministic][actors]") {
  node_run n(1, {"a", "b"});
  n.tell(actors::node_start_atom::value);
  n.peer_up(0);
  n.from_coordinator(kind::START);
  n.tell(actors::peer_down_atom::value, uint32_t{0}, std::string("goodbye"), true);
  CHECK(n.roles->exits.size() == 2);
  CHECK(n.ended());
  CHECK(n.result->error.empty());
}

// --- the worker: pulls again what was not answered ---

/// The shards of tiny_model(): weight [2, 3] on shard 0, bias [2] on shard 1.
actors::shard_source_config two_shards() {
  actors::shard_source_config c;
  c.self = worker_addr(0);
  c.layout = tiny_model().layout();
  const auto ranges = model::plan_shards(c.layout, 2);
  for (uint32_t s = 0; s < 2; ++s) c.shards.push_back({shard_addr(s), ranges[s], {}, -1});
  return c;
}

struct worker_run {
  std::shared_ptr<recorded> seen = std::make_shared<recorded>();
  std::shared_ptr<actors::directory> dir;
  caf_testing t;
  caf::actor worker;

  /// `speed` > 1: a slower device, holding each step's result (speed - 1) x its compute time.
  explicit worker_run(std::chrono::milliseconds reply_timeout, float speed = 1) {
    dir = make_directory(t.recorder(seen), {loader_addr(0), shard_addr(0), shard_addr(1), coordinator_addr()}, {},
                         nullptr);
    auto pool = std::make_shared<actors::replica_pool>(tiny_model);
    train::worker_plan p = worker_plan_of(0);
    p.speed = speed;
    auto core = std::make_shared<actors::worker_core>(p, pool, actors::shard_weights(two_shards()));
    worker = t.keep(actors::spawn_worker(t.sys(), core, loader_addr(0), coordinator_addr(), 2, reply_timeout, dir));
    dir->add(worker_addr(0), worker);
  }
  void send(const net::message& m) {
    actors::send_to(*dir, worker_addr(0), m);
    t.run();
  }
  std::size_t pulls(uint32_t shard) const { return seen->to(shard_addr(shard), wire::Envelope::PULL_PARAMS).size(); }
  void answer(uint32_t shard) {
    const std::vector<float> w{1, 2, 3, 4, 5, 6, 7, 8};
    send(shard == 0 ? params_message(0, worker_addr(0), 0, 0, 0, {{shape{2, 3}, {w.begin(), w.begin() + 6}}})
                    : params_message(1, worker_addr(0), 0, 1, 6, {{shape{2}, {w.begin() + 6, w.end()}}}));
  }
};

TEST_CASE("worker actor: a pull not answered within its reply timeout is sent again", "[deterministic][actors]") {
  worker_run w(1000ms);  // a cluster's: answers may be lost
  w.send(actors::make_control(coordinator_addr(), worker_addr(0), kind::START));
  CHECK(w.seen->controls(loader_addr(0), kind::CREDIT).size() == 1);
  REQUIRE(w.pulls(0) == 1);
  REQUIRE(w.pulls(1) == 1);
  // No round trip measured yet: it waits 20 ms (8 x the round trip, at least 20 ms, at most the timeout).
  w.t.advance(19ms);
  CHECK(w.pulls(0) == 1);
  CHECK(w.pulls(1) == 1);
  w.t.advance(1ms);
  CHECK(w.pulls(0) == 2);
  CHECK(w.pulls(1) == 2);
  // Shard 0 answers: only shard 1 is pulled again.
  w.answer(0);
  w.t.advance(20ms);
  CHECK(w.pulls(0) == 2);
  CHECK(w.pulls(1) == 3);
  // Every shard answered: no more pulls, however long it waits.
  w.answer(1);
  w.t.advance(10s);
  CHECK(w.pulls(0) == 2);
  CHECK(w.pulls(1) == 3);
}

TEST_CASE("worker actor: the reply timeout caps the wait, and without one it never pulls again",
          "[deterministic][actors]") {
  {
    worker_run w(5ms);
    w.send(actors::make_control(coordinator_addr(), worker_addr(0), kind::START));
    w.t.advance(5ms);
    CHECK(w.pulls(1) == 2);
    w.t.advance(5ms);
    CHECK(w.pulls(1) == 3);
  }
  {
    worker_run w(0ms);  // one process: nothing is lost
    w.send(actors::make_control(coordinator_addr(), worker_addr(0), kind::START));
    REQUIRE(w.pulls(1) == 1);
    w.t.advance(60s);
    CHECK(w.pulls(0) == 1);
    CHECK(w.pulls(1) == 1);
  }
}

TEST_CASE("worker actor: a push not answered is followed by pulls within the reply timeout",
          "[deterministic][actors]") {
  worker_run w(1000ms);
  w.send(actors::make_control(coordinator_addr(), worker_addr(0), kind::START));
  w.answer(0);
  w.answer(1);
  w.send(batch_message(tiny_images(), tiny_labels));
  // One step: a credit back to the loader, a push to each shard.
  CHECK(w.seen->controls(loader_addr(0), kind::CREDIT).size() == 2);
  CHECK(w.seen->to(shard_addr(0), wire::Envelope::PUSH_GRADIENT).size() == 1);
  CHECK(w.seen->to(shard_addr(1), wire::Envelope::PUSH_GRADIENT).size() == 1);
  CHECK(w.seen->to(coordinator_addr(), wire::Envelope::METRICS).empty());  // reported once answered
  // The wait is 8 x the round trip measured, at least 20 ms and at most the reply timeout.
  w.t.advance(19ms);
  CHECK(w.pulls(0) == 1);
  CHECK(w.pulls(1) == 1);
  w.t.advance(981ms);
  CHECK(w.pulls(0) == 2);
  CHECK(w.pulls(1) == 2);
  // The shards' answers (to the pulls) let the worker go on and report its step.
  w.answer(0);
  w.answer(1);
  CHECK(w.seen->to(coordinator_addr(), wire::Envelope::METRICS).size() == 1);
}

TEST_CASE("worker actor: a worker on a slower device holds its pushes until its hold has passed",
          "[deterministic][actors]") {
  worker_run w(0ms, 3.0f);
  w.send(actors::make_control(coordinator_addr(), worker_addr(0), kind::START));
  w.answer(0);
  w.answer(1);
  w.send(batch_message(tiny_images(), tiny_labels));
  w.send(batch_message(tiny_images(), tiny_labels));
  // The step ran (its batch's credit went back); its pushes wait for 2 x its compute time.
  CHECK(w.seen->controls(loader_addr(0), kind::CREDIT).size() == 2);
  CHECK(w.seen->to(shard_addr(0), wire::Envelope::PUSH_GRADIENT).empty());
  CHECK(w.seen->to(shard_addr(1), wire::Envelope::PUSH_GRADIENT).empty());
  w.t.advance(1s);
  CHECK(w.seen->to(shard_addr(0), wire::Envelope::PUSH_GRADIENT).size() == 1);
  CHECK(w.seen->to(shard_addr(1), wire::Envelope::PUSH_GRADIENT).size() == 1);
  // The second batch waits for the shards' answers to the push, not for the clock.
  w.t.advance(1s);
  CHECK(w.seen->controls(loader_addr(0), kind::CREDIT).size() == 2);
}

// --- a pipeline stage: credits and a slower device's pace ---

model::model mlp5() {
  model::model m = nn::sequential(nn::dense(6, 5), nn::relu(), nn::dense(5, 4), nn::relu(), nn::dense(4, 3));
  m.build({6}, 1);
  return m;
}

/// Stage 0 of 2 of mlp5() (layers [0, 2)), GPipe with 2 micro-batches, for `mini_batches` mini-batches.
std::shared_ptr<actors::stage_core> first_stage(float slowdown, int64_t mini_batches) {
  model::model whole = mlp5();
  const model::param_layout layout = whole.layout();
  actors::stage_config c;
  c.plan.address = stage_addr(0);
  c.plan.first_layer = 0;
  c.plan.last_layer = 2;
  c.plan.params = {0, 2, 0, layout[2].offset};
  c.plan.slowdown = slowdown;
  // The device's measured action times: each output is held until its action has lasted 1 s.
  c.plan.fwd_action_s = 1.0;
  c.plan.bwd_action_s = 1.0;
  c.index = 0;
  c.stages = 2;
  c.previous = stage_addr(0);
  c.next = stage_addr(1);
  c.coordinator = coordinator_addr();
  c.layout = layout;
  c.schedule = model::pipeline_schedule::gpipe;
  c.micro_batches = 2;
  c.total_micro_batches = 2 * mini_batches;
  c.opt.lr = 0.1f;
  c.opt.momentum = 0;
  auto flat = whole.flatten();
  std::vector<float> initial(flat.values.data(), flat.values.data() + c.plan.params.end);
  return std::make_shared<actors::stage_core>(c, mlp5().slice(0, 2), initial);
}

net::message batch_of(uint64_t index) {
  const tensor x =
      tensor::from({4, 6}, {1, 0, -1, 0.5f, 2, 1, 0, 1, 2, -1, 0.5f, 0, 3, 1, 0, 0, -2, 1, 1, 1, 1, 0, 0, 0});
  const std::vector<int32_t> y{0, 1, 2, 1};
  auto b = net::make_builder();
  auto batch = net::init_envelope(*b, loader_addr(0), stage_addr(0)).initBatch();
  batch.setIndex(index);
  net::encode(x, batch.initImages());
  auto l = batch.initLabels(static_cast<unsigned>(y.size()));
  for (unsigned i = 0; i < l.size(); ++i) l.set(i, y[i]);
  return net::message::from_builder(std::move(b));
}

net::message gradient_to_first(uint64_t mb) {
  auto b = net::make_builder();
  auto g = net::init_envelope(*b, stage_addr(1), stage_addr(0)).initGradient();
  g.setMicroBatch(mb);
  g.setStage(1);
  net::encode(tensor::from({2, 5}, {0.1f, -0.2f, 0.3f, 0, 0.05f, 0.1f, -0.1f, 0.2f, 0, 0.3f}), g.initTensor());
  return net::message::from_builder(std::move(b));
}

struct stage_run {
  std::shared_ptr<recorded> seen = std::make_shared<recorded>();
  std::shared_ptr<actors::directory> dir;
  caf_testing t;
  std::shared_ptr<actors::stage_core> core;
  caf::actor stage;

  stage_run(float slowdown, int prefetch, int64_t mini_batches = 2) : core(first_stage(slowdown, mini_batches)) {
    dir = make_directory(t.recorder(seen), {loader_addr(0), stage_addr(1), coordinator_addr(), evaluator_addr()}, {},
                         nullptr);
    stage = t.keep(actors::spawn_stage(t.sys(), core, loader_addr(0), coordinator_addr(), prefetch, dir));
    dir->add(stage_addr(0), stage);
  }
  void send(const net::message& m) {
    actors::send_to(*dir, stage_addr(0), m);
    t.run();
  }
  std::size_t activations() const { return seen->to(stage_addr(1), wire::Envelope::ACTIVATION).size(); }
  /// Batches the loader was given credit for.
  uint32_t credited() const {
    uint32_t n = 0;
    for (const auto& m : seen->controls(loader_addr(0), kind::CREDIT)) n += control_of(m).second;
    return n;
  }
};

TEST_CASE("stage actor: the first stage credits its loader one batch per mini-batch it has taken",
          "[deterministic][actors]") {
  stage_run s(1.0f, 1, 3);  // a device at full speed: no holds
  s.send(actors::make_control(coordinator_addr(), stage_addr(0), kind::START));
  CHECK(s.credited() == 1);  // its prefetch
  s.send(batch_of(0));
  // Both micro-batches forwarded at once; the mini-batch is taken: one more credit.
  CHECK(s.activations() == 2);
  CHECK(s.credited() == 2);
  // GPipe flushes: the next mini-batch waits for the backward passes and the update.
  s.send(batch_of(1));
  CHECK(s.activations() == 2);
  CHECK(s.credited() == 2);
  s.send(gradient_to_first(0));
  s.send(gradient_to_first(1));
  CHECK(s.activations() == 4);
  CHECK(s.credited() == 3);
  CHECK(s.core->applied_mini_batches() == 1);
}

TEST_CASE("stage actor: a stage on a slower device holds each output until its action has lasted the device's time",
          "[deterministic][actors]") {
  stage_run s(3.0f, 1);
  s.send(actors::make_control(coordinator_addr(), stage_addr(0), kind::START));
  s.send(batch_of(0));
  // The first forward ran; its activation is held (the device needs 1 s), the second forward waits.
  CHECK(s.activations() == 0);
  s.t.advance(500ms);
  CHECK(s.activations() == 0);
  s.t.advance(500ms);
  CHECK(s.activations() == 1);  // released; the second micro-batch's forward is held now
  s.t.advance(500ms);
  CHECK(s.activations() == 1);
  s.t.advance(500ms);
  CHECK(s.activations() == 2);
  CHECK(s.credited() == 2);
  // Backward passes are held too: the update waits for both.
  s.send(gradient_to_first(0));
  s.send(gradient_to_first(1));
  CHECK(s.core->applied_mini_batches() == 0);
  s.t.advance(1s);
  CHECK(s.core->applied_mini_batches() == 0);
  s.t.advance(1s);
  s.t.advance(0s);  // the update's output: no hold left to make up
  CHECK(s.core->applied_mini_batches() == 1);
}

TEST_CASE("stage actor: a snapshot's pull is answered once the stage has applied the mini-batches it counts",
          "[deterministic][actors]") {
  stage_run s(1.0f, 1);
  s.send(actors::make_control(coordinator_addr(), stage_addr(0), kind::START));
  s.send(batch_of(0));
  s.send(actors::make_pull(evaluator_addr(), stage_addr(0), false, 1));
  CHECK(s.seen->to(evaluator_addr(), wire::Envelope::PARAMS).empty());  // mini-batch 0 is not applied yet
  s.send(gradient_to_first(0));
  CHECK(s.seen->to(evaluator_addr(), wire::Envelope::PARAMS).empty());
  s.send(gradient_to_first(1));
  REQUIRE(s.seen->to(evaluator_addr(), wire::Envelope::PARAMS).size() == 1);
  CHECK(s.core->applied_mini_batches() == 1);
}

} // namespace
