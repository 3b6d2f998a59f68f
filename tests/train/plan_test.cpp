// The plan: who runs what where, for several topologies, against hand-computed
// placements, data ranges, thread splits and update counts.
#include <catch2/catch.hpp>

#include <set>

#include "tests/test_util.hpp"
#include "train/plan.hpp"

using namespace troupe;
using namespace troupe::train;
using Catch::Matchers::Contains;

namespace {

/// Four tensors of 6, 2, 8 and 2 elements.
model::param_layout four_tensors() {
  return model::param_layout({{"w0", {2, 3}}, {"b0", {2}}, {"w1", {2, 4}}, {"b1", {2}}});
}

settings with(algorithm_kind k, int workers, int shards = 1, int64_t batch = 10, int epochs = 1) {
  settings s;
  s.algo.kind = k;
  s.algo.workers = workers;
  s.algo.shards = shards;
  s.batch_size = batch;
  s.epochs = epochs;
  return s;
}

node_spec node(const std::string& name, int threads, bool workers = true, bool shards = true) {
  node_spec n;
  n.name = name;
  n.threads = threads;
  n.run_workers = workers;
  n.run_shards = shards;
  return n;
}

topology nodes(std::vector<node_spec> ns) {
  topology t;
  t.nodes = std::move(ns);
  return t;
}

/// Every address of the plan is unique, and loaders and workers name each other.
void check_addresses(const plan& p) {
  std::set<net::address> all{p.coordinator, p.evaluator};
  std::size_t n = 2;
  REQUIRE(p.loaders.size() == p.workers.size());
  for (std::size_t i = 0; i < p.workers.size(); ++i) {
    all.insert(p.loaders[i].address);
    all.insert(p.workers[i].address);
    n += 2;
    CHECK(p.loaders[i].address.role == net::role::loader);
    CHECK(p.workers[i].address.role == net::role::worker);
    CHECK(p.workers[i].address.index == i);
    CHECK(p.loaders[i].worker == p.workers[i].address);
    CHECK(p.workers[i].loader == p.loaders[i].address);
    CHECK(p.loaders[i].address.node == p.workers[i].address.node);  // a loader feeds a worker of its node
  }
  for (std::size_t s = 0; s < p.shards.size(); ++s) {
    all.insert(p.shards[s].address);
    ++n;
    CHECK(p.shards[s].address.role == net::role::shard);
    CHECK(p.shards[s].address.index == s);
  }
  CHECK(all.size() == n);
  CHECK(p.coordinator == net::address{0, net::role::coordinator, 0});
  CHECK(p.evaluator == net::address{0, net::role::evaluator, 0});
}

} // namespace

TEST_CASE("plan: one local node runs every role", "[train][plan]") {
  const topology t = topology::local(4);
  REQUIRE(t.nodes.size() == 1);
  CHECK(t.nodes[0].threads == 4);
  CHECK(topology::local(0).nodes.at(0).threads >= 1);  // every core

  settings s = with(algorithm_kind::asgd, 2, 2, 10, 3);
  s.seed = 5;
  const plan p = make_plan(s, t, four_tensors(), 100);
  check_addresses(p);
  REQUIRE(p.workers.size() == 2);
  CHECK(p.loaders[0].begin == 0);
  CHECK(p.loaders[0].end == 50);
  CHECK(p.loaders[1].begin == 50);
  CHECK(p.loaders[1].end == 100);
  CHECK(p.loaders[0].seed == 5u);
  CHECK(p.loaders[1].seed == 5u + 1000003u);
  for (const auto& w : p.workers) {
    CHECK(w.address.node == 0u);
    CHECK(w.threads == 2);  // 4 threads over 2 workers
    CHECK(w.speed == 1.0f);
  }
  // {6, 2 | 8, 2} = 10 beats {6 | 2, 8, 2} = 12 and {6, 2, 8 | 2} = 16.
  REQUIRE(p.shards.size() == 2);
  CHECK(p.shards[0].range.first == 0u);
  CHECK(p.shards[0].range.last == 2u);
  CHECK(p.shards[1].range.begin == 8);
  CHECK(p.shards[1].range.end == 18);
  CHECK(p.shard_of(1) == 0u);
  CHECK(p.shard_of(2) == 1u);
  CHECK(p.shard_of(3) == 1u);
  CHECK_THROWS_AS(p.shard_of(4), troupe::error);
  REQUIRE(p.nodes.size() == 1);
  CHECK(p.nodes[0].workers == 2);
  CHECK(p.nodes[0].shards == 2);
  CHECK(p.nodes[0].scheduler_threads == 2);  // no more than its workers
  CHECK(p.samples_per_epoch == 100);
  CHECK(p.batches_per_epoch == 10);  // 5 + 5
  CHECK(p.total_updates == 30);      // 10 batches x 3 epochs
  CHECK_THAT(p.describe(), Contains("worker 1 on node 0: samples [50, 100), 2 thread(s)"));
  CHECK_THAT(p.describe(), Contains("shard 1 on node 0: tensors [2, 4), 10 parameters"));
}

TEST_CASE("plan: three nodes take workers and shards round-robin", "[train][plan]") {
  const topology t = nodes({node("a", 4), node("b", 2), node("c", 1)});
  const plan p = make_plan(with(algorithm_kind::dc_asgd_a, 5, 2), t, four_tensors(), 50);
  check_addresses(p);
  const uint32_t want_node[5] = {0, 1, 2, 0, 1};
  for (uint32_t i = 0; i < 5; ++i) {
    INFO("worker " << i);
    CHECK(p.workers[i].address == net::address{want_node[i], net::role::worker, i});
    CHECK(p.loaders[i].address == net::address{want_node[i], net::role::loader, i});
    CHECK(p.loaders[i].begin == 10 * i);
    CHECK(p.loaders[i].end == 10 * (i + 1));
  }
  CHECK(p.shards[0].address == net::address{0, net::role::shard, 0});
  CHECK(p.shards[1].address == net::address{1, net::role::shard, 1});
  // Threads: node a's 4 over 2 workers, b's 2 over 2, c's 1 over 1.
  CHECK(p.workers[0].threads == 2);
  CHECK(p.workers[1].threads == 1);
  CHECK(p.workers[2].threads == 1);
  CHECK(p.nodes[0].workers == 2);
  CHECK(p.nodes[1].workers == 2);
  CHECK(p.nodes[2].workers == 1);
  CHECK(p.nodes[0].shards == 1);
  CHECK(p.nodes[1].shards == 1);
  CHECK(p.nodes[2].shards == 0);
  CHECK(p.nodes[0].scheduler_threads == 2);
  CHECK(p.nodes[1].scheduler_threads == 2);
  CHECK(p.nodes[2].scheduler_threads == 1);
}

TEST_CASE("plan: uneven data splits", "[train][plan]") {
  // 7 samples over 3 workers: [0, 2), [2, 4), [4, 7); in batches of 2: 1 + 1 + 2 per epoch.
  const plan p = make_plan(with(algorithm_kind::asgd, 3, 1, 2, 2), topology::local(3), four_tensors(), 7);
  REQUIRE(p.loaders.size() == 3);
  CHECK(p.loaders[0].begin == 0);
  CHECK(p.loaders[0].end == 2);
  CHECK(p.loaders[1].begin == 2);
  CHECK(p.loaders[1].end == 4);
  CHECK(p.loaders[2].begin == 4);
  CHECK(p.loaders[2].end == 7);
  CHECK(p.batches_per_epoch == 4);
  CHECK(p.total_updates == 8);
  // As many workers as samples: one each.
  const plan one_each = make_plan(with(algorithm_kind::asgd, 4), topology::local(1), four_tensors(), 4);
  for (int i = 0; i < 4; ++i) CHECK(one_each.loaders[i].end - one_each.loaders[i].begin == 1);
  CHECK_THROWS_MATCHES(make_plan(with(algorithm_kind::asgd, 5), topology::local(1), four_tensors(), 4), troupe::error,
                       testing::message(Contains("--workers 5 exceeds the 4 training samples")));
}

TEST_CASE("plan: more shards than nodes, nodes that may not run workers or shards", "[train][plan]") {
  const plan p = make_plan(with(algorithm_kind::asgd, 2, 3), nodes({node("a", 2), node("b", 2)}), four_tensors(), 20);
  check_addresses(p);
  REQUIRE(p.shards.size() == 3);
  CHECK(p.shards[0].address.node == 0u);
  CHECK(p.shards[1].address.node == 1u);
  CHECK(p.shards[2].address.node == 0u);
  CHECK(p.nodes[0].shards == 2);
  CHECK(p.nodes[1].shards == 1);

  // Node 0 hosts no workers, node 1 no shards, node 2 both.
  const topology t = nodes({node("ps", 8, false, true), node("gpu", 4, true, false), node("both", 2)});
  const plan q = make_plan(with(algorithm_kind::ddc_asgd, 3, 3), t, four_tensors(), 30);
  check_addresses(q);
  CHECK(q.workers[0].address.node == 1u);
  CHECK(q.workers[1].address.node == 2u);
  CHECK(q.workers[2].address.node == 1u);
  CHECK(q.shards[0].address.node == 0u);
  CHECK(q.shards[1].address.node == 2u);
  CHECK(q.shards[2].address.node == 0u);
  CHECK(q.nodes[0].workers == 0);
  CHECK(q.nodes[0].scheduler_threads == 1);
  CHECK(q.nodes[1].workers == 2);
  CHECK(q.workers[0].threads == 2);  // 4 threads over 2 workers
  CHECK(q.workers[1].threads == 2);  // 2 threads, 1 worker
  // Shards take a worker's share of threads where workers run too, else the node's.
  CHECK(q.nodes[0].shard_threads == 8);
  CHECK(q.nodes[2].shard_threads == 2);
  CHECK(p.nodes[0].shard_threads == 2);  // 2 threads, 1 worker
  // The coordinator and the evaluator stay on node 0 even when it runs no workers.
  CHECK(q.coordinator.node == 0u);

  CHECK_THROWS_MATCHES(make_plan(with(algorithm_kind::asgd, 1), nodes({node("a", 1, false, true)}), four_tensors(), 10),
                       troupe::error, testing::message(Contains("no node of the topology may run workers")));
  CHECK_THROWS_MATCHES(make_plan(with(algorithm_kind::asgd, 1), nodes({node("a", 1, true, false)}), four_tensors(), 10),
                       troupe::error, testing::message(Contains("no node of the topology may run parameter shards")));
  // Hogwild! needs no shards.
  CHECK_NOTHROW(make_plan(with(algorithm_kind::hogwild, 1), nodes({node("a", 1, true, false)}), four_tensors(), 10));
}

TEST_CASE("plan: thread splits per node", "[train][plan]") {
  // 8 threads over 3 workers: 2 each (the rest for the runtime); 1 thread over 2 workers: 1 each.
  const plan p =
      make_plan(with(algorithm_kind::asgd, 5), nodes({node("big", 8), node("small", 1)}), four_tensors(), 10);
  // Round-robin: workers 0, 2, 4 on node 0; 1, 3 on node 1.
  CHECK(p.nodes[0].workers == 3);
  CHECK(p.nodes[1].workers == 2);
  for (int i : {0, 2, 4}) CHECK(p.workers[i].threads == 2);
  for (int i : {1, 3}) CHECK(p.workers[i].threads == 1);
  CHECK(p.nodes[0].scheduler_threads == 3);
  CHECK(p.nodes[1].scheduler_threads == 1);
  CHECK_THROWS_MATCHES(make_plan(with(algorithm_kind::asgd, 1), nodes({node("a", 0)}), four_tensors(), 10),
                       troupe::error, testing::message(Contains("node a: threads must be at least 1, got 0")));
  CHECK_THROWS_MATCHES(make_plan(with(algorithm_kind::asgd, 1), topology{}, four_tensors(), 10), troupe::error,
                       testing::message(Contains("the topology has no nodes")));
}

TEST_CASE("plan: total updates for SSGD, push-every, and tiny runs", "[train][plan]") {
  // 100 samples, 2 workers, batches of 10: 10 batches per epoch, 3 epochs.
  settings s = with(algorithm_kind::asgd, 2, 1, 10, 3);
  CHECK(make_plan(s, topology::local(2), four_tensors(), 100).total_updates == 30);
  s.algo.push_every = 4;
  CHECK(make_plan(s, topology::local(2), four_tensors(), 100).total_updates == 7);  // 30 / 4
  s = with(algorithm_kind::ssgd, 2, 1, 10, 3);
  CHECK(make_plan(s, topology::local(2), four_tensors(), 100).total_updates == 15);  // a round of 2 is one update
  // 95 samples: 47 + 48 in batches of 10 are 5 + 5 batches.
  CHECK(make_plan(s, topology::local(2), four_tensors(), 95).batches_per_epoch == 10);
  // Never below 1: one batch per epoch, one epoch, a push every 4 steps.
  s = with(algorithm_kind::asgd, 1, 1, 10, 1);
  s.algo.push_every = 4;
  CHECK(make_plan(s, topology::local(1), four_tensors(), 3).total_updates == 1);
}

TEST_CASE("plan: Hogwild! shares one buffer on one node, speeds, shard count errors", "[train][plan]") {
  const plan h = make_plan(with(algorithm_kind::hogwild, 2), topology::local(2), four_tensors(), 10);
  CHECK(h.shards.empty());
  CHECK(h.nodes[0].shards == 0);
  check_addresses(h);
  CHECK_THROWS_MATCHES(make_plan(with(algorithm_kind::hogwild, 2), nodes({node("a", 1), node("b", 1)}), four_tensors(),
                                 10),
                       troupe::error, testing::message(Contains("runs on one node, the topology has 2")));
  // Bug: the plan read the slowdowns troupe::job derives, not the settings'
  // worker speeds: settings made without a job ran every worker at full speed.
  settings s = with(algorithm_kind::asgd, 2);
  s.algo.worker_speeds = {5.0f, 2.0f};  // larger is faster: worker 1 is 2.5 times slower
  const plan p = make_plan(s, topology::local(2), four_tensors(), 10);
  CHECK(p.workers[0].speed == 1.0f);
  CHECK(p.workers[1].speed == 2.5f);
  CHECK_THAT(p.describe(), Contains("2.5"));
  s.algo.worker_speeds = {4.0f, 2.0f, 1.0f};
  CHECK_THROWS_MATCHES(make_plan(s, topology::local(2), four_tensors(), 10), troupe::error,
                       testing::message(Contains("--worker-speeds: 3 speeds for 2 workers")));
  settings five = with(algorithm_kind::asgd, 1, 5);
  five.algo.shard_cut = model::shard_cut::tensors;
  CHECK_THROWS_MATCHES(make_plan(five, topology::local(1), four_tensors(), 10), troupe::error,
                       testing::message(Contains("--shards 5 exceeds the model's 4")));
  // The default cut (auto) cuts more shards than tensors evenly.
  five.algo.shard_cut = model::shard_cut::automatic;
  const plan even = make_plan(five, topology::local(1), four_tensors(), 10);
  REQUIRE(even.shards.size() == 5);
  CHECK(even.shard_cut.cut == model::shard_cut::even);
  CHECK_THAT(even.describe(), Contains("shards: cut evenly (more shards than tensors)"));
}

TEST_CASE("plan: what differs between one process and a cluster is the plan's values", "[train][plan]") {
  const model::param_layout layout = four_tensors();
  // One process: nothing to pull again (nothing is lost), Hogwild! shares one buffer.
  const plan one = make_plan(with(algorithm_kind::asgd, 2), nodes({node("local", 2)}), layout, 100);
  CHECK(one.pull_retry_s == 0);
  CHECK_FALSE(one.shared_buffer);
  CHECK_FALSE(one.costs_measured);
  CHECK(make_plan(with(algorithm_kind::hogwild, 2), nodes({node("local", 2)}), layout, 100).shared_buffer);
  // A cluster: a worker pulls again after the peer timeout, except under SSGD (its rounds wait for every worker).
  topology two = nodes({node("a", 1), node("b", 1)});
  two.peer_timeout_s = 2.5;
  CHECK(make_plan(with(algorithm_kind::asgd, 2), two, layout, 100).pull_retry_s == 2.5);
  CHECK(make_plan(with(algorithm_kind::ssgd, 2), two, layout, 100).pull_retry_s == 0);
  CHECK_THROWS_WITH(make_plan(with(algorithm_kind::hogwild, 2), two, layout, 100),
                    Contains("shares one buffer in one process"));
}
