// Allreduce workers without actors: N worker cores, each with its own replica,
// exchange their Collective messages (delivered here in a seeded random
// order) and step alike. N workers of batch b against one model stepped by
// hand on the N*b samples together; the replicas bit-identical.
#include <catch2/catch.hpp>

#include <capnp/serialize.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>

#include "actors/allreduce.hpp"
#include "actors/messages.hpp"
#include "kernels/kernels.hpp"
#include "model/nn.hpp"
#include "model/optimizer.hpp"
#include "tests/actors/ps_messages.hpp"

using namespace troupe;
using namespace troupe::actors;
using namespace troupe::testing;
using Catch::Matchers::Contains;

namespace {

model::model small_mlp() {
  model::model m = nn::sequential(nn::dense(6, 8), nn::relu(), nn::dense(8, 3));
  m.build({6}, 7);
  return m;
}

std::vector<float> values_of(model::model& m) {
  const model::model::flat_buffers f = m.flatten();
  return std::vector<float>(f.values.data(), f.values.data() + f.values.numel());
}

/// N allreduce workers of small_mlp() and the messages between them.
struct group {
  std::vector<std::unique_ptr<worker_core>> workers;
  std::vector<outgoing> in_flight;
  std::vector<net::message> answers;  // the holders' answers to the evaluator's pulls
  std::mt19937 order{11};

  group(int n, int64_t bucket_elements, bool overlap, bool bf16 = false, int64_t small_threshold = 0,
        bool adamw = false) {
    auto pool = std::make_shared<replica_pool>([] { return small_mlp(); });
    model::model m = small_mlp();
    allreduce_config c;
    for (int i = 0; i < n; ++i) c.members.push_back(worker_addr(static_cast<uint32_t>(i)));
    c.layout = m.layout();
    c.initial = values_of(m);
    c.opt.lr = 0.05f;
    c.opt.momentum = 0.9f;
    c.opt.total_steps = 100;
    c.opt.adamw = adamw;
    c.bucket_elements = bucket_elements;
    c.options.piece(5).bf16(bf16).small_threshold(small_threshold);
    c.holder = true;  // every one answers a pull here, to compare them
    for (int i = 0; i < n; ++i) {
      c.member = i;
      workers.push_back(std::make_unique<worker_core>(worker_plan_of(static_cast<uint32_t>(i)), pool,
                                                      allreduce_weights(c)));
      if (overlap) workers.back()->overlap([this](outgoing&& o) { in_flight.push_back(std::move(o)); }, true);
    }
  }
  /// Delivers every message, in a random order, until none is left.
  void deliver() { deliver_some(SIZE_MAX); }
  /// Delivers up to `n` messages, in a random order.
  void deliver_some(std::size_t n) {
    for (; n > 0 && !in_flight.empty(); --n) {
      const std::size_t k = std::uniform_int_distribution<std::size_t>(0, in_flight.size() - 1)(order);
      outgoing o = std::move(in_flight[k]);
      in_flight.erase(in_flight.begin() + static_cast<std::ptrdiff_t>(k));
      worker_core& w = *workers.at(o.to.index);
      for (outgoing& next : w.on_collective(w.open(o.msg))) send(std::move(next));
    }
  }
  void send(outgoing&& o) {
    (o.to.role == net::role::evaluator ? answers.push_back(std::move(o.msg)) : in_flight.push_back(std::move(o)));
  }
  /// Every worker steps on its batch of step `s` (b samples); their messages wait in in_flight.
  void step_all(int s, int b);
  /// Worker i's step on `batch` to its end: each time its backward lets messages
  /// in, up to `deliver` of those in flight are delivered first. Returns how
  /// many times it let them in.
  int step_letting_in(std::size_t i, const net::message& batch, std::size_t deliver) {
    worker_core& w = *workers[i];
    worker_core::step_out out = w.step(batch);
    int yields = 0;
    for (; out.yielded; ++yields) {
      for (outgoing& o : out.pushes) in_flight.push_back(std::move(o));
      REQUIRE(w.yielded());
      REQUIRE_FALSE(w.can_resume());  // only go_on() goes on
      deliver_some(deliver);
      out = w.go_on();
    }
    for (outgoing& o : out.pushes) in_flight.push_back(std::move(o));
    return yields;
  }
  /// Worker i's parameters, as its answer to a pull.
  std::vector<float> params(std::size_t i) {
    worker_core& w = *workers[i];
    const std::vector<outgoing> a = w.on_pull(w.open(make_pull(evaluator_addr(), worker_addr(i))));
    REQUIRE(a.size() == 1);
    return read_params(a[0].msg).values;
  }
};

/// Step `s`'s batch for worker `i` of a group whose workers take `b` samples each.
tensor batch_of(int s, int i, int b, std::vector<int32_t>& labels) {
  std::mt19937 gen(static_cast<unsigned>(1000 * s + i));
  std::normal_distribution<float> x(0.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(b) * 6);
  for (float& e : v) e = x(gen);
  labels.resize(static_cast<std::size_t>(b));
  for (int k = 0; k < b; ++k) labels[k] = static_cast<int32_t>((v[k * 6] > 0) + (v[k * 6 + 1] > 0.5f));
  return tensor::from({b, 6}, v);
}

void group::step_all(int s, int b) {
  std::vector<int32_t> y;
  for (std::size_t i = 0; i < workers.size(); ++i) {
    auto out = workers[i]->step(batch_message(batch_of(s, static_cast<int>(i), b, y), y,
                                              worker_addr(static_cast<uint32_t>(i))));
    for (outgoing& o : out.pushes) in_flight.push_back(std::move(o));
  }
}

} // namespace

TEST_CASE("allreduce: N workers of batch b step as one model on the N*b samples, replicas bit-identical",
          "[actors][allreduce]") {
  struct mode {
    int workers;
    int64_t bucket;
    bool overlap;
    int64_t small = 0;  // recursive doubling below this many bytes
  };
  for (mode m : {mode{1, 0, false}, mode{2, 0, false}, mode{3, 20, true}, mode{4, 1, true}, mode{3, 40, false},
                 mode{3, 20, true, 8192}, mode{5, 0, false, 8192}}) {
    INFO(m.workers << " workers, buckets of " << m.bucket << " elements, overlap " << m.overlap << ", small "
                   << m.small);
    const int b = 4;
    group g(m.workers, m.bucket, m.overlap, false, m.small);
    model::model ref = small_mlp();
    auto opt = optim::sgd(0.05f).momentum(0.9f).make();
    const kernels::context ctx{};
    for (int s = 0; s < 100; ++s) {
      std::vector<float> all_x;
      std::vector<int32_t> all_y, y;
      double mean_loss = 0;
      for (int i = 0; i < m.workers; ++i) {
        const tensor x = batch_of(s, i, b, y);
        all_x.insert(all_x.end(), x.data(), x.data() + x.numel());
        all_y.insert(all_y.end(), y.begin(), y.end());
        worker_core& w = *g.workers[static_cast<std::size_t>(i)];
        REQUIRE(w.can_step());
        worker_core::step_out out = w.step(batch_message(x, y, worker_addr(static_cast<uint32_t>(i))));
        REQUIRE_FALSE(out.paused);
        mean_loss += out.loss / m.workers;
        for (outgoing& o : out.pushes) g.in_flight.push_back(std::move(o));
        CHECK(w.can_step() == (m.workers == 1));  // with others: not until the reduction is over
      }
      g.deliver();
      tensor dl;
      const double loss = kernels::softmax_cross_entropy(
          ctx, ref.forward(ctx, tensor::from({m.workers * b, 6}, all_x), true), all_y, &dl);
      ref.backward(ctx, dl);
      opt->step(ctx, ref.parameters());
      INFO("step " << s);
      CHECK(std::abs(mean_loss - loss) <= 1e-4 * std::abs(loss));
      for (auto& w : g.workers) REQUIRE(w->ready());
    }
    const std::vector<float> first = g.params(0);
    for (std::size_t i = 1; i < g.workers.size(); ++i) {
      const std::vector<float> other = g.params(i);
      REQUIRE(other.size() == first.size());
      CHECK(std::memcmp(other.data(), first.data(), first.size() * sizeof(float)) == 0);
    }
    const std::vector<float> expected = values_of(ref);
    REQUIRE(expected.size() == first.size());
    for (std::size_t k = 0; k < first.size(); ++k) CHECK(first[k] == Approx(expected[k]).margin(1e-4));
  }
}

TEST_CASE("allreduce: a worker holds its parameters for a pull only when it is the holder, with its momentum",
          "[actors][allreduce]") {
  group g(2, 0, false);
  g.step_all(0, 3);
  g.deliver();
  worker_core& w = *g.workers[0];
  const auto a = w.on_pull(w.open(make_pull(evaluator_addr(), worker_addr(0), true)));
  REQUIRE(a.size() == 1);
  net::envelope_reader r(a[0].msg);
  CHECK(r.root().getParams().getVersion() == 1u);
  REQUIRE(r.root().getParams().getRuleState().size() == 1);
  CHECK(std::string(r.root().getParams().getRuleState()[0].getName().cStr()) == "velocity");

  // A worker that is not the holder (or another source) refuses a pull as a kind not for it.
  model::model m = small_mlp();
  allreduce_config c;
  c.members = {worker_addr(0)};
  c.layout = m.layout();
  c.initial = values_of(m);
  worker_core lone(worker_plan_of(0), std::make_shared<replica_pool>([] { return small_mlp(); }), allreduce_weights(c));
  CHECK_THROWS_WITH(lone.on_pull(lone.open(make_pull(evaluator_addr(), worker_addr(0)))),
                    Contains("a PullParams for a worker that holds none"));
}

TEST_CASE("allreduce: the holder keeps a snapshot's pull until it has applied the steps the pull counts",
          "[actors][allreduce]") {
  group g(2, 0, false);
  g.step_all(0, 3);
  // Both workers have reported step 1 (2 reports) while worker 0 still reduces it: its pull waits.
  worker_core& w = *g.workers[0];
  CHECK(w.on_pull(w.open(make_pull(evaluator_addr(), worker_addr(0), false, 2))).empty());
  // A pull for what is applied already (none) is answered at once.
  CHECK(w.on_pull(w.open(make_pull(evaluator_addr(), worker_addr(0), false, 0))).size() == 1);
  std::vector<net::message> answers;
  while (!g.in_flight.empty()) {
    outgoing o = std::move(g.in_flight.back());
    g.in_flight.pop_back();
    worker_core& to = *g.workers.at(o.to.index);
    for (outgoing& next : to.on_collective(to.open(o.msg)))
      (next.to.role == net::role::evaluator ? answers.push_back(next.msg) : g.in_flight.push_back(std::move(next)));
  }
  REQUIRE(answers.size() == 1);
  CHECK(net::envelope_reader(answers[0]).root().getParams().getVersion() == 1u);  // after the step
}

TEST_CASE("allreduce: a Collective that cannot be part of the operation fails the worker, a duplicate does not",
          "[actors][allreduce]") {
  group g(2, 0, false);
  std::vector<int32_t> y;
  std::vector<outgoing> sent;
  for (int i = 0; i < 2; ++i) {
    auto out = g.workers[i]->step(batch_message(batch_of(0, i, 3, y), y, worker_addr(i)));
    for (outgoing& o : out.pushes) sent.push_back(std::move(o));
  }
  REQUIRE_FALSE(sent.empty());
  // A piece from worker 0 to worker 1, altered to claim a place no round has.
  collective_message bad = from_wire(net::envelope_reader(sent.front().msg));
  bad.offset += 1000;
  worker_core& w1 = *g.workers[1];
  CHECK_THROWS_AS(w1.on_collective(w1.open(to_wire(bad, worker_addr(0), worker_addr(1)))), net::message_error);
  // Delivered twice: the second is a duplicate, counted and dropped.
  g.in_flight = std::move(sent);
  const net::message again = g.in_flight.front().msg;
  g.deliver();
  CHECK_NOTHROW(w1.on_collective(w1.open(again)));
  CHECK(g.workers[0]->ready());
  CHECK(w1.ready());
}

TEST_CASE("allreduce: the wire form carries every field and rejects partial elements", "[actors][allreduce]") {
  collective_message m;
  m.epoch = 3;
  m.op = 9;
  m.kind = collective_kind::allreduce;
  m.round = 2;
  m.chunk = 1;
  m.offset = 40;
  m.sender = 1;
  m.receiver = 0;
  m.data = {1.5f, -2.0f};
  const collective_message back = from_wire(net::envelope_reader(to_wire(m, worker_addr(1), worker_addr(0))));
  CHECK(back.epoch == 3u);
  CHECK(back.op == 9u);
  CHECK(back.round == 2);
  CHECK(back.chunk == 1);
  CHECK(back.offset == 40);
  CHECK(back.sender == 1);
  CHECK(back.receiver == 0);
  CHECK(back.data == m.data);
  m.data = {std::nanf("")};
  CHECK_THROWS_AS(net::envelope_reader(to_wire(m, worker_addr(1), worker_addr(0))), net::message_error);
  // A large piece travels in a segment of its own (net::external_payload), whole words, the padding zero;
  // through a frame's bytes, as between nodes, it reads back the same, in float32 and in bfloat16 (odd count).
  for (const bool half : {false, true}) {
    collective_message big = m;
    const std::size_t n = net::pooled_payload_bytes / 2 + 3;
    big.data.clear();
    big.bf16.clear();
    for (std::size_t i = 0; i < n; ++i) {
      if (half) big.bf16.push_back(static_cast<uint16_t>(0x3f80 + i % 64));
      else big.data.push_back(static_cast<float>(i) * 0.25f);
    }
    const net::message w = to_wire(big, worker_addr(1), worker_addr(0));
    const std::size_t bytes = n * (half ? 2 : 4);
    REQUIRE(w.segments().size() == 2);
    const auto seg = w.segments()[1];
    CHECK(seg.size() == (bytes + 7) / 8);
    for (std::size_t i = bytes; i < seg.size() * 8; ++i) CHECK(reinterpret_cast<const uint8_t*>(seg.begin())[i] == 0);
    const kj::Array<capnp::word> flat = capnp::messageToFlatArray(w.segments());
    const auto flat_bytes = flat.asBytes();
    const collective_message read =
        from_wire(net::envelope_reader(net::message::from_bytes(flat_bytes.begin(), flat_bytes.size())));
    CHECK(read.data == big.data);
    CHECK(read.bf16 == big.bf16);
  }
}

TEST_CASE("allreduce in bfloat16: the replicas stay bit-identical, near the float32 steps", "[actors][allreduce]") {
  group f32(3, 20, true), bf16(3, 20, true, true);
  std::vector<int32_t> y;
  for (int s = 0; s < 30; ++s) {
    for (group* g : {&f32, &bf16}) {
      for (int i = 0; i < 3; ++i) {
        worker_core& w = *g->workers[static_cast<std::size_t>(i)];
        auto out = w.step(batch_message(batch_of(s, i, 4, y), y, worker_addr(static_cast<uint32_t>(i))));
        for (outgoing& o : out.pushes) g->in_flight.push_back(std::move(o));
      }
      g->deliver();
    }
  }
  const std::vector<float> a = bf16.params(0), exact = f32.params(0);
  for (std::size_t i = 1; i < 3; ++i) {
    const std::vector<float> other = bf16.params(i);
    CHECK(std::memcmp(other.data(), a.data(), a.size() * sizeof(float)) == 0);
  }
  double diff = 0, norm = 0;
  for (std::size_t k = 0; k < a.size(); ++k) {
    diff += (a[k] - exact[k]) * (a[k] - exact[k]);
    norm += exact[k] * exact[k];
  }
  CHECK(diff > 0);                        // the gradients did travel rounded
  CHECK(std::sqrt(diff / norm) < 0.01);  // by about bf16's precision, not more
}

namespace {

/// The coordinator's part of a regroup: hold the members that stay, collect their steps, let the group go.
uint64_t regroup_group(group& g, uint64_t epoch, const std::vector<uint32_t>& members,
                       const std::vector<uint32_t>& joiners, uint64_t reports = 0) {
  const net::address coordinator{0, net::role::coordinator, 0};
  regroup hold;
  hold.epoch = epoch;
  uint64_t least = UINT64_MAX;
  for (uint32_t i : members) {
    if (std::find(joiners.begin(), joiners.end(), i) != joiners.end()) continue;
    worker_core& w = *g.workers[i];
    const auto out = w.on_regroup(w.open(make_regroup(coordinator, worker_addr(i), hold)));
    REQUIRE(out.size() == 1);
    const regroup rep = read_regroup(net::envelope_reader(out[0].msg));
    CHECK(rep.phase == regroup::report);
    least = std::min(least, rep.step);
  }
  regroup go;
  go.epoch = epoch;
  go.phase = regroup::go;
  go.step = least;
  go.members = members;
  go.joiners = joiners;
  go.root = members.front();
  go.reports = reports;
  for (uint32_t i : members) {
    worker_core& w = *g.workers[i];
    for (outgoing& o : w.on_regroup(w.open(make_regroup(coordinator, worker_addr(i), go)))) g.send(std::move(o));
  }
  return least;
}

/// The version (global steps applied) of worker i's replica.
uint64_t version_of(group& g, std::size_t i) {
  worker_core& w = *g.workers[i];
  const auto a = w.on_pull(w.open(make_pull(evaluator_addr(), worker_addr(static_cast<uint32_t>(i)))));
  return read_params(a[0].msg).version;
}

} // namespace

TEST_CASE("allreduce: a worker lost mid-step, the others redo the step without it, one that joins takes the parameters",
          "[actors][allreduce][elastic]") {
  for (unsigned seed : {1u, 2u, 3u, 4u, 5u, 6u}) {
    // Momentum SGD, and AdamW (whose moments, twice the parameters, a rollback restores and the joiner receives).
    const bool adamw = seed % 2 == 0;
    INFO("delivery seed " << seed << (adamw ? ", AdamW" : ", momentum"));
    group g(3, 20, true, false, seed > 3 ? 8192 : 0, adamw);  // the ring, and recursive doubling with a binomial-tree broadcast
    g.order.seed(seed);
    std::vector<int32_t> y;
    auto step_all = [&](int s, const std::vector<std::size_t>& who) {
      for (std::size_t i : who) {
        worker_core& w = *g.workers[i];
        REQUIRE(w.can_step());
        auto out = w.step(batch_message(batch_of(s, static_cast<int>(i), 4, y), y, worker_addr(i)));
        for (outgoing& o : out.pushes) g.in_flight.push_back(std::move(o));
      }
    };
    for (int s = 0; s < 3; ++s) {
      step_all(s, {0, 1, 2});
      g.deliver();
    }
    // Step 3: some of its pieces arrive, then worker 2 dies: nothing more goes to or comes from it.
    step_all(3, {0, 1, 2});
    std::mt19937 cut(seed);
    const std::size_t deliver_first = std::uniform_int_distribution<std::size_t>(0, 8)(cut);
    for (std::size_t k = 0; k < deliver_first && !g.in_flight.empty(); ++k) {
      outgoing o = std::move(g.in_flight.front());
      g.in_flight.erase(g.in_flight.begin());
      if (o.to.index == 2) continue;
      worker_core& w = *g.workers.at(o.to.index);
      for (outgoing& next : w.on_collective(w.open(o.msg))) g.in_flight.push_back(std::move(next));
    }
    g.in_flight.clear();  // the rest was to or from the lost node, or is dropped with its group
    const uint64_t kept = regroup_group(g, 1, {0, 1}, {});
    CHECK(kept == 3);  // nobody finished step 3 with worker 2's pieces missing... or it was rolled back
    g.deliver();
    CHECK(version_of(g, 0) == 4);
    CHECK(version_of(g, 1) == 4);
    CHECK(g.params(0) == g.params(1));
    for (int s = 4; s < 6; ++s) {
      step_all(s, {0, 1});
      g.deliver();
    }
    // The same command on the lost node: a fresh worker 2 that joins and takes the parameters by broadcast.
    {
      model::model m = small_mlp();
      allreduce_config c;
      for (uint32_t i = 0; i < 3; ++i) c.members.push_back(worker_addr(i));
      c.member = 2;
      c.layout = m.layout();
      c.initial = values_of(m);
      c.opt.lr = 0.05f;
      c.opt.momentum = 0.9f;
      c.opt.total_steps = 100;
      c.opt.adamw = adamw;
      c.bucket_elements = 20;
      c.options.piece(5).small_threshold(seed > 3 ? 8192 : 0);  // as the group's
      c.holder = true;
      g.workers[2] = std::make_unique<worker_core>(worker_plan_of(2), std::make_shared<replica_pool>(small_mlp),
                                                   allreduce_weights(c));
    }
    step_all(6, {2});  // it starts before it hears of the group: that step is dropped
    const uint64_t joined_at = regroup_group(g, 2, {0, 1, 2}, {2});
    CHECK(joined_at == 6);
    g.deliver();
    CHECK(version_of(g, 2) == 6);
    for (int s = 6; s < 9; ++s) {
      step_all(s, {0, 1, 2});
      g.deliver();
    }
    CHECK(version_of(g, 2) == 9);
    CHECK(g.params(0) == g.params(1));
    CHECK(g.params(0) == g.params(2));
  }
}

TEST_CASE("allreduce: a worker that finished a step the others did not rolls it back when the group re-forms",
          "[actors][allreduce][elastic]") {
  group g(3, 20, true);
  std::vector<int32_t> y;
  auto step = [&](group& into, int s, std::size_t i, int data_of) {
    worker_core& w = *into.workers[i];
    REQUIRE(w.can_step());
    auto out = w.step(batch_message(batch_of(s, data_of, 4, y), y, worker_addr(static_cast<uint32_t>(i))));
    for (outgoing& o : out.pushes) into.in_flight.push_back(std::move(o));
  };
  for (int s = 0; s < 3; ++s) {
    for (std::size_t i = 0; i < 3; ++i) step(g, s, i, static_cast<int>(i));
    g.deliver();
  }
  // Step 3: everything is delivered but the pieces to worker 1, until worker 0 has applied the step.
  for (std::size_t i = 0; i < 3; ++i) step(g, 3, i, static_cast<int>(i));
  std::vector<outgoing> to_1;
  while (!g.workers[0]->ready()) {
    REQUIRE_FALSE((g.in_flight.empty() && to_1.empty()));
    outgoing o;
    if (g.in_flight.empty()) {  // worker 1 gets one piece only when nothing else can go
      o = std::move(to_1.front());
      to_1.erase(to_1.begin());
    } else {
      o = std::move(g.in_flight.front());
      g.in_flight.erase(g.in_flight.begin());
      if (o.to.index == 1) {
        to_1.push_back(std::move(o));
        continue;
      }
    }
    worker_core& w = *g.workers.at(o.to.index);
    for (outgoing& next : w.on_collective(w.open(o.msg))) g.in_flight.push_back(std::move(next));
  }
  REQUIRE(version_of(g, 0) == 4);
  REQUIRE(version_of(g, 1) == 3);
  // Worker 2 is lost now: the group of 0 and 1 goes on after step 3, worker 0 undoing its step 4.
  g.in_flight.clear();
  CHECK(regroup_group(g, 1, {0, 1}, {}) == 3);
  g.deliver();
  CHECK(version_of(g, 0) == 4);
  CHECK(version_of(g, 1) == 4);
  // Worker 0's step 4 counted worker 2's gradient, the redone one does not: both replicas hold the redone one.
  CHECK(g.params(0) == g.params(1));
}

TEST_CASE("allreduce: after a regroup the holder counts the coordinator's reports from the go, one per member and step",
          "[actors][allreduce][elastic]") {
  group g(3, 20, true);
  std::vector<int32_t> y;
  auto step_all = [&](int s, const std::vector<std::size_t>& who) {
    for (std::size_t i : who) {
      auto out = g.workers[i]->step(batch_message(batch_of(s, static_cast<int>(i), 4, y), y, worker_addr(i)));
      for (outgoing& o : out.pushes) g.in_flight.push_back(std::move(o));
    }
    g.deliver();
  };
  worker_core& w = *g.workers[0];
  auto pull = [&](uint64_t steps) {
    for (outgoing& o : w.on_pull(w.open(make_pull(evaluator_addr(), worker_addr(0), false, steps))))
      g.send(std::move(o));
  };
  auto answered = [&]() {  // the versions answered since the last call
    std::vector<uint64_t> v;
    for (const net::message& m : g.answers) v.push_back(net::envelope_reader(m).root().getParams().getVersion());
    g.answers.clear();
    return v;
  };
  for (int s = 0; s < 3; ++s) step_all(s, {0, 1, 2});
  pull(9);  // 3 steps of 3 reports
  CHECK(answered() == std::vector<uint64_t>{3});
  pull(12);
  pull(15);
  // Worker 2 is lost. The coordinator had counted 10 reports (one of a step some
  // worker undid): the group of two goes on from there, 2 reports a step.
  CHECK(regroup_group(g, 1, {0, 1}, {}, 10) == 3);
  CHECK(answered().empty());
  step_all(3, {0, 1});
  CHECK(answered() == std::vector<uint64_t>{4});  // 12 reports
  step_all(4, {0, 1});
  CHECK(answered().empty());  // 14: counting 3 a step would answer 15 now, a step early
  pull(16);
  step_all(5, {0, 1});
  CHECK(answered() == std::vector<uint64_t>{6, 6});  // 16
  // The group of three again, no step of the two in between, one report undone:
  // the last snapshot's pull (the run's end) is answered, not kept for ever.
  pull(17);
  CHECK(regroup_group(g, 2, {0, 1}, {}, 17) == 6);
  CHECK(answered() == std::vector<uint64_t>{6});
}

TEST_CASE("allreduce: a backward that lets the pieces in between its layers gives the same bits",
          "[actors][allreduce]") {
  // Buckets of 20 elements cut small_mlp()'s gradient in two: the last layer's
  // reduction is under way while backward goes on with the layers before.
  for (unsigned seed : {1u, 2u, 3u, 4u}) {
    INFO("seed " << seed);
    group plain(3, 20, true), letting_in(3, 20, true);
    for (auto& w : letting_in.workers) w->yield_in_backward(true);
    letting_in.order.seed(seed);
    std::mt19937 how_many(seed);
    int yields = 0;
    std::vector<int32_t> y;
    for (int s = 0; s < 20; ++s) {
      plain.step_all(s, 4);
      plain.deliver();
      for (std::size_t i = 0; i < 3; ++i) {
        const net::message b = batch_message(batch_of(s, static_cast<int>(i), 4, y), y, worker_addr(static_cast<uint32_t>(i)));
        yields += letting_in.step_letting_in(i, b, std::uniform_int_distribution<std::size_t>(0, 6)(how_many));
      }
      letting_in.deliver();
      for (auto& w : letting_in.workers) REQUIRE(w->ready());
    }
    CHECK(yields > 20);  // it did let messages in, and it could go on with pieces of the next bucket's op
    for (std::size_t i = 0; i < 3; ++i) CHECK(letting_in.params(i) == plain.params(0));
  }
}

TEST_CASE("allreduce: the group re-forms while a step lets pieces in during its backward: the step is redone",
          "[actors][allreduce][elastic]") {
  for (unsigned seed : {1u, 2u, 3u, 4u, 5u}) {
    INFO("seed " << seed);
    // g: worker 2 is lost while worker 0's backward lets pieces in; reference: it is lost before step 3.
    group g(3, 20, true), reference(3, 20, true);
    for (auto& w : g.workers) w->yield_in_backward(true);
    g.order.seed(seed);
    std::vector<int32_t> y;
    auto batch = [&](int s, std::size_t i) {
      return batch_message(batch_of(s, static_cast<int>(i), 4, y), y, worker_addr(static_cast<uint32_t>(i)));
    };
    for (int s = 0; s < 3; ++s) {
      for (std::size_t i = 0; i < 3; ++i) g.step_letting_in(i, batch(s, i), 2);
      g.deliver();
      reference.step_all(s, 4);
      reference.deliver();
    }
    CHECK(regroup_group(reference, 1, {0, 1}, {}) == 3);
    reference.deliver();
    for (std::size_t i : {0, 1}) {
      auto out = reference.workers[i]->step(batch(3, i));
      for (outgoing& o : out.pushes) reference.in_flight.push_back(std::move(o));
    }
    reference.deliver();
    // Step 3 in g: workers 1 and 2 go through their backward; worker 0's starts its first bucket and lets messages in.
    for (std::size_t i : {1, 2}) g.step_letting_in(i, batch(3, i), 0);
    worker_core& w0 = *g.workers[0];
    worker_core::step_out out = w0.step(batch(3, 0));
    REQUIRE(out.yielded);
    // Some pieces move (the first bucket may be reduced with worker 2's gradient), then worker 2 is lost:
    // what is in flight belongs to the old group (dropped when the new one goes) or to the lost worker.
    std::mt19937 cut(seed);
    g.deliver_some(std::uniform_int_distribution<std::size_t>(0, 10)(cut));
    g.in_flight.clear();
    CHECK(regroup_group(g, 1, {0, 1}, {}) == 3);
    while (out.yielded) {
      g.deliver_some(3);
      out = w0.go_on();
    }
    for (outgoing& o : out.pushes) g.in_flight.push_back(std::move(o));
    g.deliver();
    CHECK(version_of(g, 0) == 4);
    CHECK(version_of(g, 1) == 4);
    // The step redone by 0 and 1 alone: the bits of the group that lost worker 2 before it.
    CHECK(g.params(0) == reference.params(0));
    CHECK(g.params(1) == reference.params(0));
  }
}
