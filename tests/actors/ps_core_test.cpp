// The parameter-server roles without actors: shard planning, the shard's
// handling of pulls, pushes and bad messages, and the worker's pushes.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "actors/ps_core.hpp"
#include "kernels/kernels.hpp"
#include "model/nn.hpp"
#include "net/tensor_codec.hpp"
#include "tests/actors/ps_messages.hpp"
#include "tests/test_util.hpp"

using namespace troupe;
using namespace troupe::actors;
using namespace troupe::testing;
using Catch::Matchers::Contains;

namespace {
/// The references' context: one thread, as a worker_config's default.
const kernels::context ctx{};
} // namespace

TEST_CASE("plan_shards balances tensors by size, largest first", "[actors]") {
  shard_plan p = plan_shards({10, 3, 7, 5}, 2);
  // 10 -> s0; 7 -> s1; 5 -> s1 (7 < 10); 3 -> s0 (10 < 12).
  CHECK(p.owner == std::vector<int>{0, 0, 1, 1});
  CHECK(p.elements == std::vector<int64_t>{13, 12});
  CHECK(p.members[0] == std::vector<int>{0, 1});
  CHECK(p.members[1] == std::vector<int>{2, 3});
  // Every shard gets a tensor even when sizes are equal.
  shard_plan q = plan_shards({4, 4, 4}, 3);
  for (auto& m : q.members) CHECK(m.size() == 1);
  CHECK_THROWS_MATCHES(plan_shards({1, 2}, 3), troupe::error, testing::message(Contains("exceeds the model's 2")));
  CHECK_THROWS_MATCHES(plan_shards({1, 2}, 0), troupe::error, testing::message(Contains("--shards")));
}

TEST_CASE("shard: pull, ASGD pushes, versions and staleness", "[actors]") {
  shard_core s = small_shard("asgd", 2);
  auto r = s.handle(make_pull(0, 0));
  REQUIRE(r.size() == 1);
  CHECK(r[0].first == 0u);
  CHECK(read_params(r[0].second).values == std::vector<float>{1, 2, 3});

  // Worker 0 pushes on version 0: w - 0.5 g.
  r = s.handle(push_message(0, 0, grad(2, 4, 6)));
  REQUIRE(r.size() == 1);
  params_view v = read_params(r[0].second);
  CHECK(v.values == std::vector<float>{0, 0, 0});
  CHECK(v.version == 1u);
  CHECK(v.tau == 0u);
  // Worker 1 also computed on version 0: staleness 1.
  r = s.handle(push_message(1, 0, grad(1, 1, 1)));
  v = read_params(r.at(0).second);
  CHECK(r[0].first == 1u);
  CHECK(v.tau == 1u);
  CHECK(v.values == std::vector<float>{-0.5f, -0.5f, -0.5f});
  CHECK(s.staleness().count() == 2);
  CHECK(s.staleness().mean() == Approx(0.5));
  CHECK(s.staleness().max() == 1);
  // The coordinator's pull is answered to the coordinator and changes nothing.
  r = s.handle(make_pull(coordinator_id, 0));
  CHECK(r.at(0).first == coordinator_id);
  CHECK(read_params(r[0].second).version == 2u);
}

TEST_CASE("shard: a Params a worker holds never changes; updates go in place once it is let go", "[actors]") {
  using tensors_t = std::vector<std::pair<shape, std::vector<float>>>;
  // Adjacent payloads live in the Params message; a [3] before b leaves a gap,
  // so those parameters live in the shard and every version is a new message.
  for (bool gap : {false, true}) {
    INFO((gap ? "payloads with a gap" : "adjacent payloads"));
    const tensors_t init = gap ? tensors_t{{shape{3}, {1, 2, 3}}, {shape{1}, {4}}}
                               : tensors_t{{shape{2}, {1, 2}}, {shape{1}, {3}}};
    tensors_t g = init;  // the gradient: 2 * the initial values
    std::vector<float> expect;
    for (auto& [sh, v] : g)
      for (float& x : v) {
        expect.push_back(x);
        x *= 2;
      }
    std::vector<named_tensor> ts;
    for (auto& [sh, v] : init) ts.push_back({"t" + std::to_string(ts.size()), tensor::from(sh, v)});
    shard_core s(0, ts, small_rule("asgd", 1, 0.25f), "constant", 100);
    // ASGD, lr 0.25, gradient 2 w0: each push subtracts 0.5 w0.
    std::vector<float> w0 = expect, w1(w0.size()), w2(w0.size()), w3(w0.size());
    for (std::size_t i = 0; i < w0.size(); ++i) {
      w1[i] = w0[i] * 0.5f;
      w2[i] = w1[i] - 0.5f * w0[i];
      w3[i] = w2[i] - 0.5f * w0[i];
    }
    net::message p0 = s.handle(make_pull(0, 0)).at(0).second;
    // The worker still holds p0: the update goes to a copy, p0 stays version 0.
    net::message p1 = s.handle(push_message(0, 0, g)).at(0).second;
    CHECK(read_params(p0).values == w0);
    CHECK(read_params(p0).version == 0u);
    CHECK(read_params(p1).values == w1);
    CHECK(read_params(p1).version == 1u);
    CHECK(first_payload(p1) != first_payload(p0));
    p0 = net::message();
    // p1 is held through the next push (adjacent payloads this time) too.
    net::message p2 = s.handle(push_message(0, 1, g, true)).at(0).second;
    CHECK(read_params(p1).values == w1);
    CHECK(read_params(p1).version == 1u);
    CHECK(read_params(p2).values == w2);
    const float* where = first_payload(p2);
    p1 = net::message();
    p2 = net::message();
    // Nobody holds the parameters now: with adjacent payloads they are updated
    // and answered in place, the same buffer with a new header.
    auto r = s.handle(push_message(0, 2, g, true));
    const params_view v3 = read_params(r.at(0).second);
    CHECK(v3.values == w3);
    CHECK(v3.version == 3u);
    CHECK(v3.tau == 0u);
    if (!gap) CHECK(first_payload(r[0].second) == where);
    std::vector<float> snap;
    for (const auto& t : s.snapshot()) snap.insert(snap.end(), t.value.data(), t.value.data() + t.value.numel());
    CHECK(snap == w3);
    // A rejected push is answered with the same parameters, flagged.
    auto bad = s.handle(push_message(0, 9, g), 0);
    CHECK(read_params(bad.at(0).second).rejected);
    CHECK(read_params(bad[0].second).values == w3);
    CHECK_FALSE(read_params(r[0].second).rejected);  // the answer before keeps its header
  }
}

TEST_CASE("shard: SSGD answers every worker of a round with one message", "[actors]") {
  shard_core s = small_shard("ssgd", 2, 1.0f);
  CHECK(s.handle(push_message(0, 0, grad(2, 0, 0))).empty());  // waits for the round
  CHECK(s.version() == 0u);
  auto r = s.handle(push_message(1, 0, grad(0, 2, 4)));
  REQUIRE(r.size() == 2);
  CHECK(s.version() == 1u);
  // The same immutable buffer goes to both workers.
  CHECK(r[0].second.segments().begin() == r[1].second.segments().begin());
  CHECK(read_params(r[0].second).values == std::vector<float>{0, 1, 1});  // w - mean(g)
}

TEST_CASE("shard: a checkpoint pull carries the rule's state; a restored shard continues", "[actors]") {
  shard_core a = small_shard("ddc-asgd", 2);
  for (uint32_t w = 0; w < 2; ++w) a.handle(make_pull(w, 0));
  a.handle(push_message(0, 0, grad(1, 2, 3)));
  a.handle(push_message(1, 0, grad(-1, 1, 2)));
  // A worker's pull carries no state; the coordinator's checkpoint pull does.
  {
    net::envelope_reader r(a.handle(make_pull(0, 0)).at(0).second);
    CHECK(r.root().getParams().getRuleState().size() == 0);
  }
  net::envelope_reader r(a.handle(make_pull(coordinator_id, 0, true)).at(0).second);
  auto p = r.root().getParams();
  net::checkpoint c;
  c.optimizer_kind = "ddc-asgd";
  c.shard_versions = {p.getVersion()};
  for (auto& t : net::decode(p.getRuleState(), "state")) c.optimizer.push_back({"shard0/" + t.name, t.value});
  REQUIRE(c.optimizer.size() == 3);  // v, ms/0, ms/1
  CHECK(c.optimizer[0].name == "shard0/v");

  // A fresh shard with the checkpoint's parameters, restored, answers the next
  // pushes exactly as the original does.
  model::update_config cfg;
  cfg.rule = "ddc-asgd";
  cfg.lr = 0.5f;
  cfg.workers = 2;
  params_view now = read_params(a.handle(make_pull(coordinator_id, 0)).at(0).second);
  shard_core b(0, {{"a", tensor::from({2}, {now.values[0], now.values[1]})}, {"b", tensor::from({1}, {now.values[2]})}},
               cfg, "constant", 100);
  std::ostringstream log;
  resume_shard(b, c, "ddc-asgd", 1, log);
  CHECK(log.str().empty());
  CHECK(b.version() == a.version());
  for (auto* s : {&a, &b})
    for (uint32_t w = 0; w < 2; ++w) s->handle(make_pull(w, 0));
  for (uint32_t w = 0; w < 2; ++w) {
    params_view va = read_params(a.handle(push_message(w, 2, grad(0.5f, -1, 1))).at(0).second);
    params_view vb = read_params(b.handle(push_message(w, 2, grad(0.5f, -1, 1))).at(0).second);
    CHECK(va.values == vb.values);
    CHECK(va.version == vb.version);
  }

  // Another algorithm's checkpoint, another shard count, or another worker count: fresh, and said so.
  shard_core fresh = small_shard("ddc-asgd", 2);
  resume_shard(fresh, c, "dc-asgd-a", 1, log);
  CHECK_THAT(log.str(), Contains("written by 'ddc-asgd', not dc-asgd-a"));
  resume_shard(fresh, c, "ddc-asgd", 2, log);
  CHECK_THAT(log.str(), Contains("the checkpoint has 1 shard(s), this run 2"));
  shard_core one_worker = small_shard("ddc-asgd", 1);
  resume_shard(one_worker, c, "ddc-asgd", 1, log);
  CHECK_THAT(log.str(), Contains("unexpected entry 'ms/1'"));
  CHECK(fresh.version() == 0u);
  CHECK(one_worker.version() == 0u);
}

TEST_CASE("shard: bad messages are rejected, counted and answered; training goes on", "[actors]") {
  shard_core s = small_shard("dc-asgd-a", 2);
  const float nan = std::numeric_limits<float>::quiet_NaN();

  struct bad_case {
    const char* what;
    net::message m;
    net::reject_reason reason;
  };
  std::vector<uint8_t> junk(200);
  for (std::size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<uint8_t>(i * 37 + 11);
  std::vector<bad_case> cases{
      {"random bytes", net::message::from_bytes(junk.data(), junk.size()), net::reject_reason::malformed},
      {"NaN gradient", push_message(0, 0, grad(nan, 1, 1)), net::reject_reason::non_finite},
      {"Inf gradient", push_message(0, 0, grad(1, INFINITY, 1)), net::reject_reason::non_finite},
      {"wrong shape", push_message(0, 0, {{shape{3}, {1, 2, 3}}, {shape{1}, {1}}}), net::reject_reason::wrong_shape},
      {"missing tensor", push_message(0, 0, {{shape{2}, {1, 2}}}), net::reject_reason::wrong_shape},
      {"unknown worker", push_message(7, 0, grad(1, 1, 1)), net::reject_reason::malformed},
      {"version from the future", push_message(0, 5, grad(1, 1, 1)), net::reject_reason::malformed},
      {"unexpected kind", make_metrics(step_report{}), net::reject_reason::unknown_kind},
  };
  uint64_t total = 0;
  for (auto& c : cases) {
    INFO(c.what);
    auto r = s.handle(c.m, /*sender_hint=*/0);
    ++total;
    CHECK(s.rejects().get(c.reason) >= 1);
    CHECK(s.rejects().total() == total);
    // The sender is answered with the unchanged parameters, flagged.
    REQUIRE(r.size() == 1);
    params_view v = read_params(r[0].second);
    CHECK(v.rejected);
    CHECK(v.values == std::vector<float>{1, 2, 3});
    CHECK(s.version() == 0u);
  }
  CHECK_THAT(s.last_error(), Contains("unexpected message kind"));
  // Without a known sender nobody is answered.
  CHECK(s.handle(net::message::from_bytes(junk.data(), 64)).empty());

  // Oversized: a shard reading untrusted input with a small limit.
  net::reader_limits small;
  small.max_bytes = 64;
  model::update_config c;
  c.workers = 1;
  shard_core tight(0, {{"a", tensor::from({2}, {1, 2})}, {"b", tensor::from({1}, {3})}}, c, "constant", 1, small);
  tight.handle(push_message(0, 0, grad(1, 1, 1)), 0);
  CHECK(tight.rejects().get(net::reject_reason::too_large) == 1);

  // A valid push afterwards is applied as usual.
  auto r = s.handle(push_message(0, 0, grad(1, 1, 1)));
  REQUIRE(r.size() == 1);
  params_view v = read_params(r[0].second);
  CHECK_FALSE(v.rejected);
  CHECK(v.version == 1u);
  CHECK(v.values[0] < 1.0f);
}

TEST_CASE("worker: pushes gradients per shard, or the accumulated change with push-every", "[actors]") {
  model::model ref = tiny_model();
  auto params = ref.parameters();  // weight [2, 3], bias [2]
  shard_plan plan = plan_shards({6, 2}, 2);

  // Shards answer the pulls with the reference values.
  auto params_msg = [&](uint32_t shard, uint64_t version, const std::vector<float>& w, const shape& sh) {
    model::update_config c;
    c.workers = 1;
    shard_core sc(shard, {{"x", tensor::from(sh, w)}}, c, "constant", 1);
    (void)version;
    return sc.handle(make_pull(0, shard)).at(0).second;
  };
  auto w0 = params[0]->value.to_vector();
  auto b0 = params[1]->value.to_vector();

  const net::message batch_msg = batch_message(tiny_images(), tiny_labels);

  for (int k : {1, 2}) {
    INFO("push every " << k);
    worker_config wc;
    wc.push_every = k;
    wc.worker_lr = 0.1f;
    worker_core w(std::make_shared<replica_pool>(tiny_model), plan, wc);
    CHECK_FALSE(w.ready());
    CHECK(w.pull().size() == 2);
    CHECK_FALSE(w.on_params(params_msg(0, 0, w0, params[0]->value.shape())));
    // A Params message of the wrong shape is refused.
    CHECK_THROWS_AS(w.on_params(params_msg(1, 0, {1, 2, 3}, {3})), net::message_error);
    CHECK(w.on_params(params_msg(1, 0, b0, params[1]->value.shape())));
    REQUIRE(w.ready());

    worker_core::step_out out;
    for (int i = 0; i < k; ++i) {
      out = w.step(batch_msg);
      CHECK(out.pushes.empty() == (i + 1 < k));
    }
    REQUIRE(out.pushes.size() == 2);
    CHECK_FALSE(w.ready());  // waits for both shards' answers

    // Expected: the gradient (k = 1) or (w_start - w_after_k_steps) / lr (k = 2),
    // computed with a plain replica and SGD.
    model::model m = tiny_model();
    auto mp = m.parameters();
    tensor x = tiny_images(), dl;
    std::vector<float> expect_w(6, 0.0f);
    for (int i = 0; i < k; ++i) {
      kernels::softmax_cross_entropy(ctx, m.forward(ctx, x, true), tiny_labels, &dl);
      m.backward(ctx, dl);
      for (int j = 0; j < 6; ++j) expect_w[j] += mp[0]->grad.at(j);
      if (k > 1) {
        for (int j = 0; j < 6; ++j) mp[0]->value.at(j) -= 0.1f * mp[0]->grad.at(j);
        for (int j = 0; j < 2; ++j) mp[1]->value.at(j) -= 0.1f * mp[1]->grad.at(j);
      }
    }
    net::envelope_reader r(out.pushes[0].second);
    auto p = r.root().getPushGradient();
    CHECK(p.getShard() == 0u);
    auto g = net::view(p.getTensors()[0], "test");
    REQUIRE(g.numel() == 6);
    for (int j = 0; j < 6; ++j) CHECK(g.data[j] == Approx(expect_w[j]).margin(1e-5));
  }
}

TEST_CASE("worker and shard: weights read in place, gradients written into a reused push, no copies", "[actors]") {
  model::model ref = tiny_model();
  auto rp = ref.parameters();
  std::vector<named_tensor> ts;
  for (auto* p : rp) ts.push_back({p->name, p->value.clone()});
  shard_core shard(0, ts, small_rule("asgd", 1, 0.1f), "constant", 100);
  worker_core w(std::make_shared<replica_pool>(tiny_model), plan_shards({6, 2}, 1), worker_config{});
  for (auto& pull : w.pull()) REQUIRE(w.on_params(shard.handle(pull).at(0).second));

  const tensor x = tiny_images();
  const net::message batch_msg = batch_message(x, tiny_labels);

  const float* push_at = nullptr;
  const float* params_at = nullptr;
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step);
    // The reference: the same step on a plain model, then plain SGD.
    tensor dl;
    kernels::softmax_cross_entropy(ctx, ref.forward(ctx, x, true), tiny_labels, &dl);
    ref.backward(ctx, dl);
    worker_core::step_out out = w.step(batch_msg);
    REQUIRE(out.pushes.size() == 1);
    {
      net::envelope_reader r(out.pushes[0].second);
      auto p = r.root().getPushGradient();
      CHECK(p.getBaseVersion() == static_cast<uint64_t>(step));
      CHECK(p.getStep() == static_cast<uint64_t>(step + 1));
      // Each step's gradient, not a sum of them.
      for (unsigned t = 0; t < 2; ++t) {
        auto g = net::view(p.getTensors()[t], "test");
        for (int64_t j = 0; j < g.numel(); ++j) CHECK(g.data[j] == Approx(rp[t]->grad.at(j)).margin(1e-6));
      }
      const float* at = net::view(p.getTensors()[0], "test").data;
      if (push_at) CHECK(at == push_at);  // the shard let the last push go: the same buffer again
      push_at = at;
    }
    for (auto* p : rp) kernels::sgd_step(ctx, p->value, p->grad, 0.1f, 0.0f);
    net::message push = std::move(out.pushes[0].second);
    out.pushes.clear();
    auto replies = shard.handle(push);
    push = net::message();
    const float* at = first_payload(replies.at(0).second);
    if (params_at) CHECK(at == params_at);  // the worker let its Params go: updated in place
    params_at = at;
    REQUIRE(w.on_params(replies[0].second));
  }
  // The shard's parameters are the reference's after three SGD steps.
  auto snap = shard.snapshot();
  for (unsigned t = 0; t < 2; ++t)
    for (int64_t j = 0; j < rp[t]->value.numel(); ++j) CHECK(snap[t].value.at(j) == Approx(rp[t]->value.at(j)).margin(1e-6));
}

TEST_CASE("loader: Batch messages carry the batcher's batches, made in place, across epochs", "[actors]") {
  data::image_dataset ds;
  ds.count = 7;
  ds.height = 2;
  ds.width = 3;
  for (int64_t i = 0; i < ds.count * 6; ++i) ds.pixels.push_back(static_cast<uint8_t>(i * 5 % 251));
  for (int64_t i = 0; i < ds.count; ++i) ds.labels.push_back(static_cast<uint8_t>(i % 10));
  const data::normalization norm{{0.5f}, {0.25f}};
  // Samples [1, 7) in batches of 4: 4 + 2 per epoch.
  loader_core loader(ds, norm, 4, 11, 1, 7, 3);
  data::batcher ref(ds, 4, norm, 11, true, 1, 7);
  CHECK(loader.batches_per_epoch() == 2);
  for (int epoch = 0; epoch < 2; ++epoch) {
    ref.start_epoch(epoch);
    data::batch want;
    while (ref.next(want)) {
      INFO("epoch " << epoch << ", " << want.labels.size() << " samples");
      net::message m = loader.next();
      net::envelope_reader r(m);
      REQUIRE(r.root().which() == wire::Envelope::BATCH);
      CHECK(r.root().getSender() == 3u);
      auto b = r.root().getBatch();
      CHECK(b.getEpoch() == static_cast<uint32_t>(epoch));
      net::tensor_view img = net::view(b.getImages(), "test");
      CHECK(img.dims == want.images.shape());
      CHECK(std::vector<float>(img.data, img.data + img.numel()) == want.images.to_vector());
      std::vector<int32_t> labels;
      for (int32_t l : b.getLabels()) labels.push_back(l);
      CHECK(labels == want.labels);
    }
  }
  CHECK(loader.epoch() == 1);
}
