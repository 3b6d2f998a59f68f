// Pipeline stages without actors: GPipe's gradients against the whole model's,
// PipeDream's weight-stashing pattern for 1F1B, the in-flight bound.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "actors/shard_core.hpp"
#include "actors/stage_core.hpp"
#include "kernels/kernels.hpp"
#include "model/nn.hpp"
#include "net/tensor_codec.hpp"
#include "tests/actors/ps_messages.hpp"

using namespace troupe;
using namespace troupe::actors;
using namespace troupe::testing;

namespace {

net::address stage_addr(uint32_t k) { return {0, net::role::stage, k}; }

model::model mlp5() {
  model::model m = nn::sequential(nn::dense(6, 5), nn::relu(), nn::dense(5, 4), nn::relu(), nn::dense(4, 3));
  m.build({6}, 1);
  return m;
}

net::message batch_of(const tensor& x, const std::vector<int32_t>& y, uint64_t index) {
  auto b = net::make_builder();
  auto batch = net::init_envelope(*b, loader_addr(0), stage_addr(0)).initBatch();
  batch.setIndex(index);
  net::encode(x, batch.initImages());
  auto l = batch.initLabels(static_cast<unsigned>(y.size()));
  for (unsigned i = 0; i < l.size(); ++i) l.set(i, y[i]);
  return net::message::from_builder(std::move(b));
}

net::message activation_of(const tensor& x, const std::vector<int32_t>& y, uint64_t mb, uint32_t from, uint32_t to) {
  auto b = net::make_builder();
  auto a = net::init_envelope(*b, stage_addr(from), stage_addr(to)).initActivation();
  a.setMicroBatch(mb);
  a.setStage(from);
  net::encode(x, a.initTensor());
  auto l = a.initLabels(static_cast<unsigned>(y.size()));
  for (unsigned i = 0; i < l.size(); ++i) l.set(i, y[i]);
  return net::message::from_builder(std::move(b));
}

net::message gradient_of(const tensor& dy, uint64_t mb, uint32_t from, uint32_t to) {
  auto b = net::make_builder();
  auto g = net::init_envelope(*b, stage_addr(from), stage_addr(to)).initGradient();
  g.setMicroBatch(mb);
  g.setStage(from);
  net::encode(dy, g.initTensor());
  return net::message::from_builder(std::move(b));
}

std::vector<float> tensor_of(const net::message& m) {
  net::envelope_reader r(m);
  auto t = r.root().which() == wire::Envelope::GRADIENT ? r.root().getGradient().getTensor()
                                                          : r.root().getActivation().getTensor();
  net::tensor_view v = net::view(t, "test");
  return std::vector<float>(v.data, v.data + v.numel());
}

/// A stage of `whole` (built by `make`) cutting layers [first, last).
std::shared_ptr<stage_core> make_stage(const std::function<model::model()>& make, int k, int stages,
                                       std::size_t first, std::size_t last, model::pipeline_schedule s, int m,
                                       int64_t total, float lr, int stash = 0) {
  model::model whole = make();
  const model::param_layout layout = whole.layout();
  const auto profile = whole.profile();
  uint32_t t0 = 0, t1 = 0;
  for (std::size_t l = 0; l < last; ++l) (l < first ? t0 : t1) += static_cast<uint32_t>(profile.tensors[l]);
  t1 += t0;
  stage_config c;
  c.plan.address = stage_addr(static_cast<uint32_t>(k));
  c.plan.first_layer = first;
  c.plan.last_layer = last;
  c.plan.params = {t0, t1, t0 < layout.size() ? layout[t0].offset : layout.numel(),
                   t1 < layout.size() ? layout[t1].offset : layout.numel()};
  c.index = k;
  c.stages = stages;
  c.previous = stage_addr(static_cast<uint32_t>(k > 0 ? k - 1 : 0));
  c.next = stage_addr(static_cast<uint32_t>(k + 1));
  c.coordinator = coordinator_addr();
  c.layout = layout;
  c.schedule = s;
  c.micro_batches = m;
  c.total_micro_batches = total;
  c.opt.lr = lr;
  c.opt.momentum = 0;
  c.stash = stash;
  auto flat = whole.flatten();
  std::vector<float> initial(flat.values.data() + c.plan.params.begin, flat.values.data() + c.plan.params.end);
  return std::make_shared<stage_core>(c, make().slice(first, last), initial);
}

std::vector<float> params_of(stage_core& s) {
  auto answers = s.take_pull(make_pull(evaluator_addr(), s.address()));
  REQUIRE(answers.size() == 1);
  return read_params(answers[0].msg).values;
}

} // namespace

TEST_CASE("pipeline: GPipe's gradients equal the whole model's full-batch gradients", "[actors][pipeline]") {
  const kernels::context ctx = kernels::context::with_threads(1);
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0, 1);
  tensor x = tensor::empty({8, 6});
  for (int64_t i = 0; i < x.numel(); ++i) x.at(i) = n(rng);
  const std::vector<int32_t> y{0, 1, 2, 0, 1, 2, 2, 1};

  // The whole model on the full batch.
  model::model whole = mlp5();
  auto flat = whole.flatten();
  const std::vector<float> w0 = flat.values.to_vector();
  tensor dlogits;
  kernels::softmax_cross_entropy(ctx, whole.forward(ctx, x, true), y, &dlogits);
  whole.backward(ctx, dlogits);
  const std::vector<float> g = flat.grads.to_vector();

  for (int m : {1, 2, 4, 3}) {
    INFO(m << " micro-batches");
    // Three stages, lr 1, no momentum: each stage's weights move by exactly its gradient.
    std::vector<std::shared_ptr<stage_core>> st{
        make_stage(mlp5, 0, 3, 0, 2, model::pipeline_schedule::gpipe, m, m, 1.0f),
        make_stage(mlp5, 1, 3, 2, 4, model::pipeline_schedule::gpipe, m, m, 1.0f),
        make_stage(mlp5, 2, 3, 4, 5, model::pipeline_schedule::gpipe, m, m, 1.0f)};
    st[0]->take(batch_of(x, y, 0));
    for (int round = 0; round < 20; ++round)
      for (auto& s : st)
        for (auto& o : s->run().messages) st.at(o.to.index)->take(o.msg);
    for (auto& s : st) REQUIRE(s->done());
    std::vector<float> moved;
    for (auto& s : st)
      for (float v : params_of(*s)) moved.push_back(v);
    REQUIRE(moved.size() == g.size());
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < g.size(); ++i) {
      const double got = w0[i] - moved[i];
      diff += (got - g[i]) * (got - g[i]);
      norm += g[i] * g[i];
    }
    CHECK(std::sqrt(diff / norm) <= 1e-6);
  }
}

TEST_CASE("pipeline: 1F1B weight stashing gives the input-gradient pattern of its version count", "[actors][pipeline]") {
  // PipeDream's test: three micro-batches forward on the same weights, then
  // backward and update in turn. With v versions kept, backward i uses the
  // weights its forward used while they are kept, else the oldest kept.
  // The stage is the second layer of two, dense(3 -> 2), which sends its input gradient back.
  auto tiny = [] {
    model::model m = nn::sequential(nn::dense(3, 3), nn::dense(3, 2));
    m.build({3}, 1);
    return m;
  };
  const tensor x = tiny_images();
  const tensor dy = tensor::from({2, 2}, {1, -1, 0.5f, 2});
  for (int versions : {1, 2, 3}) {
    INFO(versions << " stashed versions");
    // Stage 1 of 5: it warms up with three forwards (K - 1 - k = 3) and sends input gradients back.
    auto s = make_stage(tiny, 1, 5, 1, 2, model::pipeline_schedule::one_f_one_b, 1, 3, 0.5f, versions);
    for (uint64_t mb = 0; mb < 3; ++mb) s->take(activation_of(x, tiny_labels, mb, 0, 1));
    CHECK(s->run().messages.size() == 3);  // three activations on, no backward yet
    CHECK(s->in_flight() == 3);
    for (uint64_t mb = 0; mb < 3; ++mb) s->take(gradient_of(dy, mb, 2, 1));
    std::map<int64_t, std::vector<float>> dx;
    for (auto& o : s->run().messages) {
      REQUIRE(o.to == stage_addr(0));
      net::envelope_reader r(o.msg);
      dx[static_cast<int64_t>(r.root().getGradient().getMicroBatch())] = tensor_of(o.msg);
    }
    REQUIRE(dx.size() == 3);
    CHECK(s->done());
    CHECK(s->version() == 3u);
    CHECK((dx[0] == dx[1]) == (versions >= 2));
    CHECK((dx[0] == dx[2]) == (versions >= 3));
  }
}

TEST_CASE("pipeline: a stage holds no more micro-batches than its schedule's bound", "[actors][pipeline]") {
  const tensor x = tensor::from({4, 6}, std::vector<float>(24, 0.5f));
  const std::vector<int32_t> y{0, 1, 2, 1};
  for (auto sched : {model::pipeline_schedule::gpipe, model::pipeline_schedule::one_f_one_b}) {
    INFO(model::to_string(sched));
    std::vector<std::shared_ptr<stage_core>> st{make_stage(mlp5, 0, 2, 0, 2, sched, 4, 16, 0.1f),
                                                make_stage(mlp5, 1, 2, 2, 5, sched, 4, 16, 0.1f)};
    for (uint64_t b = 0; b < 4; ++b) st[0]->take(batch_of(x, y, b));
    for (int round = 0; round < 100 && !(st[0]->done() && st[1]->done()); ++round)
      for (auto& s : st)
        for (auto& o : s->run().messages) st.at(o.to.index)->take(o.msg);
    for (auto& s : st) {
      CHECK(s->done());
      CHECK(s->max_in_flight() <= s->bound());
    }
    // 1F1B: the first stage of two holds two micro-batches at most, GPipe all four of a mini-batch.
    CHECK(st[0]->max_in_flight() == (sched == model::pipeline_schedule::gpipe ? 4 : 2));
  }
}

TEST_CASE("pipeline: a stage answers a snapshot's pull once it has applied the mini-batches it names",
          "[actors][pipeline]") {
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0, 1);
  tensor x = tensor::empty({4, 6});
  for (int64_t i = 0; i < x.numel(); ++i) x.at(i) = n(rng);
  const std::vector<int32_t> y{0, 1, 2, 0};
  for (auto sched : {model::pipeline_schedule::gpipe, model::pipeline_schedule::one_f_one_b}) {
    INFO(model::to_string(sched));
    // Two stages, two micro-batches, one mini-batch.
    std::vector<std::shared_ptr<stage_core>> st{make_stage(mlp5, 0, 2, 0, 2, sched, 2, 2, 0.5f),
                                                make_stage(mlp5, 1, 2, 2, 5, sched, 2, 2, 0.5f)};
    const std::vector<float> before = params_of(*st[0]);
    // Asked for the state after mini-batch 1 before the first stage has applied it: kept.
    CHECK(st[0]->take_pull(make_pull(evaluator_addr(), st[0]->address(), false, 1)).empty());
    st[0]->take(batch_of(x, y, 0));
    std::vector<net::message> answers;
    for (int round = 0; round < 10; ++round)
      for (auto& s : st)
        for (auto& o : s->run().messages) {
          if (o.to == evaluator_addr()) answers.push_back(o.msg);
          else st.at(o.to.index)->take(o.msg);
        }
    REQUIRE(st[0]->done());
    CHECK(st[0]->applied_mini_batches() == 1);
    // Answered by the update, with the parameters after it.
    REQUIRE(answers.size() == 1);
    const std::vector<float> answered = read_params(answers[0]).values;
    CHECK(answered == params_of(*st[0]));
    CHECK(answered != before);
  }
}

namespace {

/// Two stages of mlp5, each pushing to the shard of its parameters (ASGD, one
/// replica, lr 0.5, the shards resumed at version 5), and a batch of 4 rows;
/// deliver() carries messages between them and records what stage 0 sent and got.
struct two_stage_hybrid {
  tensor x = tensor::empty({4, 6});
  const std::vector<int32_t> y{0, 1, 2, 0};
  std::vector<std::shared_ptr<stage_core>> st;
  std::vector<std::unique_ptr<shard_core>> shards;
  std::vector<net::message> answers_to_stage0;  // every Params stage 0 got, to send one again later
  std::vector<const void*> pushed_by_stage0;      // where each of its pushes' bytes lay

  two_stage_hybrid() {
    std::mt19937 rng(9);
    std::normal_distribution<float> n(0, 1);
    for (int64_t i = 0; i < x.numel(); ++i) x.at(i) = n(rng);
    model::model whole = mlp5();
    const auto params = whole.parameters();
    for (int k = 0; k < 2; ++k) {
      auto s = make_stage(mlp5, k, 2, k == 0 ? 0 : 2, k == 0 ? 2 : 5, model::pipeline_schedule::gpipe, 2, 6, 0.5f);
      stage_config c = s->config();
      c.plan.shard = k;
      c.shard = shard_addr(static_cast<uint32_t>(k));
      auto flat = whole.flatten();
      std::vector<float> initial(flat.values.data() + c.plan.params.begin, flat.values.data() + c.plan.params.end);
      train::shard_plan sp = shard_plan_of(static_cast<uint32_t>(k), c.plan.params.first, c.plan.params.last,
                                           c.plan.params.begin, c.plan.params.end);
      sp.clients = {stage_addr(static_cast<uint32_t>(k))};
      sp.stage = k;
      std::vector<named_tensor> mine;
      for (uint32_t i = sp.range.first; i < sp.range.last; ++i)
        mine.push_back({params[i]->name, params[i]->value.clone()});
      shards.push_back(std::make_unique<shard_core>(sp, mine, small_rule(model::algorithm_kind::asgd, 1),
                                                    model::lr_schedule::constant, 100, kernels::context{}));
      shards.back()->restore(5, {});  // a resumed run's shard: 5 updates applied before
      st.push_back(std::make_shared<stage_core>(c, mlp5().slice(c.plan.first_layer, c.plan.last_layer), initial));
    }
  }

  void deliver(std::vector<outgoing> out) {
    for (auto& o : out) {
      if (o.to.role != net::role::shard) {
        st.at(o.to.index)->take(o.msg);
        continue;
      }
      if (o.to.index == 0 && net::envelope_reader(o.msg).root().which() == wire::Envelope::PUSH_GRADIENT)
        pushed_by_stage0.push_back(o.msg.segments()[0].begin());
      for (auto& r : shards.at(o.to.index)->handle(o.msg)) {
        if (r.to == st[0]->address()) answers_to_stage0.push_back(r.msg);
        st.at(r.to.index)->take(r.msg);
      }
    }
  }
};

} // namespace

TEST_CASE("pipeline: a hybrid's stages pull their shards, push each mini-batch's gradient and go on with the answer",
          "[actors][pipeline]") {
  two_stage_hybrid h;
  auto& st = h.st;
  auto& shards = h.shards;
  const tensor& x = h.x;
  const std::vector<int32_t>& y = h.y;
  const auto deliver = [&h](std::vector<outgoing> out) { h.deliver(std::move(out)); };
  // The start: each stage pulls its shard; a forward waits for the answer.
  std::vector<outgoing> pulls;
  for (auto& s : st)
    for (auto& o : s->start()) pulls.push_back(std::move(o));
  CHECK(pulls.size() == 2);
  CHECK(st[0]->start().empty());  // once
  st[0]->take(batch_of(x, y, 0));
  CHECK(st[0]->run().actions == 0);
  deliver(std::move(pulls));
  for (int round = 0; round < 20; ++round)
    for (auto& s : st) deliver(s->run().messages);
  // One mini-batch: one push per stage, from the version the start pull gave (5), applied at staleness 0;
  // the stages now hold the shards' parameters.
  for (int k = 0; k < 2; ++k) {
    INFO("stage " << k);
    CHECK(shards[k]->version() == 6);
    CHECK(shards[k]->staleness().max() == 0);
    const std::vector<float> held = params_of(*st[k]);
    const auto shard_now = read_params(shards[k]->handle(make_pull(evaluator_addr(), shard_addr(k)))[0].msg).values;
    CHECK(held == shard_now);
  }
  // The second mini-batch: stage 0 pushes again; a late copy of the previous answer (version 6, not past the
  // base it pushed from) is not taken for this push's answer.
  const net::message late = h.answers_to_stage0.back();
  st[0]->take(batch_of(x, y, 1));
  std::vector<outgoing> pushes;  // stage 0's, held back
  std::vector<train::step_report> stage0_reports, stage1_reports;
  for (int round = 0; round < 20; ++round) {
    stage_core::result r0 = st[0]->run();
    stage0_reports.insert(stage0_reports.end(), r0.reports.begin(), r0.reports.end());
    for (auto& o : r0.messages) {
      if (o.to.role == net::role::shard) pushes.push_back(std::move(o));
      else st[1]->take(o.msg);
    }
    stage_core::result r1 = st[1]->run();
    stage1_reports.insert(stage1_reports.end(), r1.reports.begin(), r1.reports.end());
    deliver(std::move(r1.messages));
  }
  REQUIRE(pushes.size() == 1);
  // The push is the first one's message, rewritten in place: the shard and the transport had let go of it.
  REQUIRE(h.pushed_by_stage0.size() == 1);
  CHECK(static_cast<const void*>(pushes[0].msg.segments()[0].begin()) == h.pushed_by_stage0[0]);
  // Stage 0, before the last, reports the staleness of its first push's answer itself, with its second push;
  // the last stage's report is the mini-batch's step, with its own push's staleness.
  REQUIRE(stage0_reports.size() == 1);
  CHECK(stage0_reports[0].staleness_only);
  CHECK(stage0_reports[0].samples == 0);
  CHECK(stage0_reports[0].max_staleness == 0);
  CHECK(stage0_reports[0].rejected == 0);
  REQUIRE(stage1_reports.size() == 1);
  CHECK_FALSE(stage1_reports[0].staleness_only);
  CHECK(stage1_reports[0].samples == 4);
  const std::vector<float> before = params_of(*st[0]);
  st[0]->take(late);
  st[0]->take(batch_of(x, y, 2));
  CHECK(st[0]->run().actions == 0);  // still waiting for the answer to its push
  deliver(std::move(pushes));
  CHECK(st[0]->run().actions > 0);
  CHECK(params_of(*st[0]) != before);
  CHECK(shards[0]->version() == 7);
}

TEST_CASE("a stage's metrics carry whether they are a step or its pushes' staleness alone", "[actors][pipeline]") {
  const net::address stage{0, net::role::stage, 3}, coordinator{0, net::role::coordinator, 0};
  for (bool only : {false, true}) {
    train::step_report r;
    r.step = only ? 0 : 7;
    r.samples = only ? 0 : 64;
    r.loss = only ? 0.0 : 0.5;
    r.mean_staleness = 2.5;
    r.max_staleness = 4;
    r.rejected = 1;
    r.staleness_only = only;
    r.compute_s = only ? 0.0 : 0.125;
    const net::message m = make_metrics(stage, coordinator, r);
    const train::step_report back = read_metrics(net::envelope_reader(m));
    CHECK(back.staleness_only == only);
    CHECK(back.compute_s == r.compute_s);
    CHECK(back.step == r.step);
    CHECK(back.samples == r.samples);
    CHECK(back.mean_staleness == Approx(2.5));
    CHECK(back.max_staleness == 4);
    CHECK(back.rejected == 1);
  }
}

TEST_CASE("metrics with a negative or non-finite compute time are rejected", "[actors][pipeline]") {
  const net::address worker{0, net::role::worker, 1}, coordinator{0, net::role::coordinator, 0};
  for (double bad : {-1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    train::step_report r;
    r.samples = 64;
    r.compute_s = bad;
    const net::message m = make_metrics(worker, coordinator, r);
    CHECK_THROWS_AS(read_metrics(net::envelope_reader(m)), net::message_error);
  }
}

TEST_CASE("an emulated slower device keeps its pace: holds to its time, late timers and updates made up",
          "[actors][stage]") {
  using kind = model::pipeline_action::kind;
  train::stage_plan full;
  CHECK_FALSE(device_pace(full).holds());
  CHECK(device_pace(full).hold(kind::forward, 0.01) == 0);
  // Estimated costs only: (slowdown - 1) x the compute.
  train::stage_plan estimated;
  estimated.slowdown = 4;
  device_pace e(estimated);
  CHECK(e.hold(kind::forward, 0.01) == Approx(0.03));
  e.ended_late(0.5);  // not made up without measured times
  CHECK(e.hold(kind::backward, 0.01) == Approx(0.03));
  // Measured: a forward lasts 10 ms, a backward with its update 20 ms.
  train::stage_plan measured;
  measured.slowdown = 2;
  measured.fwd_action_s = 0.010;
  measured.bwd_action_s = 0.020;
  device_pace p(measured);
  CHECK(p.hold(kind::forward, 0.004) == Approx(0.006));
  CHECK(p.hold(kind::update, 0.003) == 0);             // counted in the backward's time:
  CHECK(p.hold(kind::backward, 0.012) == Approx(0.005));  // 20 - 12 - 3 ms
  p.ended_late(0.002);                                  // a timer that fired 2 ms late
  CHECK(p.hold(kind::forward, 0.004) == Approx(0.004));
  CHECK(p.hold(kind::forward, 0.015) == 0);              // slower here than the device: 5 ms behind
  CHECK(p.behind() == Approx(0.005));
  CHECK(p.hold(kind::backward, 0.010) == Approx(0.005));
  p.ended_late(10.0);  // a long stall is made up by at most a mini-batch's worth (4 x 30 ms)
  CHECK(p.hold(kind::forward, 0.0) == 0);
  CHECK(p.behind() == Approx(0.12));
}

TEST_CASE("pipeline: a stage opens each activation and gradient once, from take to backward", "[actors][pipeline]") {
  auto tiny = [] {
    model::model m = nn::sequential(nn::dense(3, 3), nn::dense(3, 2));
    m.build({3}, 1);
    return m;
  };
  const tensor x = tiny_images();
  const tensor dy = tensor::from({2, 2}, {1, -1, 0.5f, 2});
  auto s = make_stage(tiny, 1, 5, 1, 2, model::pipeline_schedule::one_f_one_b, 1, 3, 0.5f, 1);
  std::vector<net::message> activations, gradients;
  for (uint64_t mb = 0; mb < 3; ++mb) activations.push_back(activation_of(x, tiny_labels, mb, 0, 1));
  for (uint64_t mb = 0; mb < 3; ++mb) gradients.push_back(gradient_of(dy, mb, 2, 1));
  const uint64_t before = net::messages_opened();
  for (const auto& m : activations) s->take(m);
  const auto forwards = s->run();
  for (const auto& m : gradients) s->take(m);
  const auto backwards = s->run();
  CHECK(net::messages_opened() - before == 6);  // six messages in, each opened (and scanned) once
  CHECK(forwards.messages.size() == 3);
  CHECK(backwards.messages.size() == 3);
  CHECK(s->done());
}
