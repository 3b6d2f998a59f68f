// The worker without actors, with each of its weight sources: the shards'
// Params read in place (read-only) and gradients pushed every step, local
// steps pushing the accumulated change, and a Hogwild! buffer shared in
// process. Expected values come from a plain model stepped by hand.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>

#include "actors/messages.hpp"
#include "actors/shard_core.hpp"
#include "actors/worker_core.hpp"
#include "kernels/kernels.hpp"
#include "model/nn.hpp"
#include "model/optimizer.hpp"
#include "tests/actors/ps_messages.hpp"
#include "tests/test_util.hpp"

using namespace troupe;
using namespace troupe::actors;
using namespace troupe::testing;
using Catch::Matchers::Contains;

namespace {

/// The references' context: one thread, as a worker_plan's default.
const kernels::context ctx{};

std::vector<float> flat_values(model::model& m) {
  std::vector<float> out;
  for (auto* p : m.parameters()) {
    auto v = p->value.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

std::vector<float> flat_grads(model::model& m) {
  std::vector<float> out;
  for (auto* p : m.parameters()) {
    auto v = p->grad.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

/// One forward and backward of `m` on tiny_images(); returns the loss.
double reference_step(model::model& m, const tensor& x = tiny_images(),
                      const std::vector<int32_t>& labels = tiny_labels) {
  tensor dl;
  const double loss = kernels::softmax_cross_entropy(ctx, m.forward(ctx, x, true), labels, &dl);
  m.backward(ctx, dl);
  return loss;
}

/// The shards of tiny_model(): weight [2, 3] on shard 0, bias [2] on shard 1.
shard_source_config two_shards() {
  shard_source_config c;
  c.self = worker_addr(0);
  c.layout = tiny_model().layout();
  const auto ranges = model::plan_shards(c.layout, 2);
  for (uint32_t s = 0; s < 2; ++s) c.shards.push_back({shard_addr(s), ranges[s], {}, -1});
  return c;
}

/// Params for the shards of two_shards(), holding the first 6 and the last 2 of `w`.
net::message weight_params(const std::vector<float>& w, uint64_t version, uint64_t tau = 0, bool rejected = false) {
  return params_message(0, worker_addr(0), version, 0, 0, {{shape{2, 3}, {w.begin(), w.begin() + 6}}}, tau, rejected);
}
net::message bias_params(const std::vector<float>& w, uint64_t version, uint64_t tau = 0, bool rejected = false) {
  return params_message(1, worker_addr(0), version, 1, 6, {{shape{2}, {w.begin() + 6, w.end()}}}, tau, rejected);
}

/// A layer y = x + b with one parameter b [1] that records, during forward,
/// whether its value is read-only and where it reads it from.
struct probe_record {
  bool read_only = false;
  const float* at = nullptr;
  int forwards = 0;
};
class probe_layer final : public model::layer {
public:
  explicit probe_layer(std::shared_ptr<probe_record> r) : rec_(std::move(r)) {}
  std::string kind() const override { return "probe"; }
  std::string describe() const override { return "probe"; }
  shape infer(const shape& in, const std::string&) override { return in; }
  void initialize(std::mt19937_64&) override { b_.value = tensor::from({1}, {0.25f}); }
  const tensor& forward(const kernels::context&, const tensor& x, bool, model::layer_state& st) override {
    tensor& y_ = st.y;
    const tensor& b = b_.value;
    rec_->read_only = b.read_only();
    rec_->at = b.data();
    ++rec_->forwards;
    y_ = tensor::empty(x.shape());
    for (int64_t i = 0; i < x.numel(); ++i) y_.at(i) = x.at(i) + b.data()[0];
    return y_;
  }
  const tensor& backward(const kernels::context&, const tensor& dy, model::layer_state& st) override {
    tensor& dx_ = st.dx;
    float s = 0;
    for (int64_t i = 0; i < dy.numel(); ++i) s += dy.at(i);
    if (!b_.grad.defined()) b_.grad = tensor::zeros({1});  // a model that was not flattened
    b_.grad.at(0) = s;
    dx_ = dy;
    return dx_;
  }
  std::vector<model::parameter*> parameters() override { return {&b_}; }

private:
  std::shared_ptr<probe_record> rec_;
  model::parameter b_{"b", {}, {}};
};

model::model probed_model(std::shared_ptr<probe_record> rec) {
  std::vector<std::unique_ptr<model::layer>> layers;
  layers.push_back(nn::dense(3, 2).make());
  layers.push_back(std::make_unique<probe_layer>(std::move(rec)));
  model::model m(std::move(layers));
  m.build({3}, 1);
  return m;
}

} // namespace

TEST_CASE("worker: shard weights push each step's gradient to every shard, reports tally the answers",
          "[actors][worker]") {
  model::model ref = tiny_model();
  const std::vector<float> w0 = flat_values(ref);
  REQUIRE(w0.size() == 8);
  const shard_source_config c = two_shards();
  REQUIRE(c.shards[1].range.begin == 6);

  worker_core w(worker_plan_of(0), std::make_shared<replica_pool>(tiny_model), shard_weights(c));
  CHECK(w.address() == worker_addr(0));
  CHECK_FALSE(w.ready());
  CHECK_THROWS_MATCHES(w.step(batch_message(tiny_images(), tiny_labels)), troupe::error,
                       testing::message(Contains("before its parameters arrived")));
  const std::vector<outgoing> pulls = w.start();
  REQUIRE(pulls.size() == 2);
  for (uint32_t s = 0; s < 2; ++s) {
    CHECK(pulls[s].to == shard_addr(s));
    net::envelope_reader r(pulls[s].msg);
    REQUIRE(r.root().which() == wire::Envelope::PULL_PARAMS);
    CHECK(r.root().getPullParams().getShard() == s);
    CHECK_FALSE(r.root().getPullParams().getWithState());
    CHECK(net::read_address(r.root().getSource()) == worker_addr(0));
  }

  w.on_params(weight_params(w0, 4));
  CHECK_FALSE(w.ready());
  // Params that do not fit are refused, and the worker still waits.
  const auto refused = [&](const net::message& m, net::reject_reason why) {
    try {
      w.on_params(m);
    } catch (const net::message_error& e) {
      CHECK(e.reason() == why);
      return;
    }
    FAIL("accepted");
  };
  refused(params_message(1, worker_addr(0), 0, 1, 6, {{shape{3}, {1, 2, 3}}}), net::reject_reason::wrong_shape);
  refused(params_message(1, worker_addr(0), 0, 1, 0, {{shape{2}, {1, 2}}}), net::reject_reason::wrong_shape);
  refused(params_message(5, worker_addr(0), 0, 1, 6, {{shape{2}, {1, 2}}}), net::reject_reason::wrong_shape);
  refused(batch_message(tiny_images(), tiny_labels), net::reject_reason::unknown_kind);
  CHECK_FALSE(w.ready());
  w.on_params(bias_params(w0, 7));
  REQUIRE(w.ready());
  CHECK_FALSE(w.report_due());  // answers to the first pulls are no push's answers

  const worker_core::step_out out = w.step(batch_message(tiny_images(), tiny_labels));
  const double want_loss = reference_step(ref);
  const std::vector<float> want = flat_grads(ref);
  CHECK(out.loss == Approx(want_loss).epsilon(1e-5));
  REQUIRE(out.pushes.size() == 2);
  CHECK_FALSE(w.ready());  // waits for both shards' answers
  const uint64_t bases[2] = {4, 7};
  for (uint32_t s = 0; s < 2; ++s) {
    INFO("shard " << s);
    CHECK(out.pushes[s].to == shard_addr(s));
    net::envelope_reader r(out.pushes[s].msg);
    REQUIRE(r.root().which() == wire::Envelope::PUSH_GRADIENT);
    CHECK(net::read_address(r.root().getSource()) == worker_addr(0));
    CHECK(net::read_address(r.root().getDestination()) == shard_addr(s));
    auto p = r.root().getPushGradient();
    CHECK(p.getShard() == s);
    CHECK(p.getBaseVersion() == bases[s]);
    CHECK(p.getStep() == 1u);
    const net::flat_view g = net::view(p.getValues(), "test");
    const model::shard_range& range = c.shards[s].range;
    CHECK(g.first == range.first);
    CHECK(g.offset == range.begin);
    REQUIRE(g.numel == range.numel());
    for (int64_t j = 0; j < g.numel; ++j) CHECK(g.data[j] == Approx(want[range.begin + j]).margin(1e-6));
  }

  // The answers: staleness 3 from shard 0, a rejection (staleness 1) from shard 1.
  w.on_params(weight_params(w0, 5, 3));
  CHECK_FALSE(w.report_due());
  w.on_params(bias_params(w0, 8, 1, true));
  CHECK(w.ready());
  REQUIRE(w.report_due());
  const train::step_report rep = w.report();
  CHECK(rep.worker == 0u);
  CHECK(rep.step == 1u);
  CHECK(rep.samples == 2u);
  CHECK(rep.loss == Approx(out.loss));
  CHECK(rep.mean_staleness == Approx(2.0));
  CHECK(rep.max_staleness == 3u);
  CHECK(rep.rejected == 1u);
  CHECK(rep.compute_s > 0);  // the step's forward, backward and pushes, timed as they ran
  CHECK(rep.compute_s < 60);
  CHECK_FALSE(w.report_due());
  const train::step_report none = w.report();
  CHECK(none.samples == 0u);
  CHECK(none.compute_s == 0);  // counted since the last report

  // A batch that does not fit the model, or no batch at all, is refused.
  CHECK_THROWS_AS(w.step(batch_message(tensor::zeros({2, 4}), tiny_labels)), net::message_error);
  CHECK_THROWS_AS(w.step(make_pull(worker_addr(0), shard_addr(0))), net::message_error);
}

TEST_CASE("worker: local steps push the accumulated change as a gradient at the worker's lr", "[actors][worker]") {
  const float lr = 0.1f;
  for (int k : {1, 2}) {
    for (float momentum : {0.0f, 0.5f}) {
      INFO("k = " << k << ", momentum " << momentum);
      model::model ref = tiny_model();
      const std::vector<float> w0 = flat_values(ref);
      worker_core w(worker_plan_of(0), std::make_shared<replica_pool>(tiny_model),
                    local_steps(two_shards(), k, lr, momentum));
      CHECK(w.start().size() == 2);
      w.on_params(weight_params(w0, 0));
      w.on_params(bias_params(w0, 0));
      REQUIRE(w.ready());

      worker_core::step_out out;
      for (int i = 0; i < k; ++i) {
        out = w.step(batch_message(tiny_images(), tiny_labels));
        CHECK(out.pushes.empty() == (i + 1 < k));
        CHECK(w.ready() == (i + 1 < k));  // ready between local steps, waiting after a push
      }
      REQUIRE(out.pushes.size() == 2);

      // Expected: (w_start - w_after_k_steps) / lr, the steps taken by the same optimizer on a plain model.
      auto opt = optim::sgd(lr).momentum(momentum).make();
      for (int i = 0; i < k; ++i) {
        reference_step(ref);
        opt->step(ctx, ref.parameters());
      }
      const std::vector<float> wk = flat_values(ref);
      for (uint32_t s = 0; s < 2; ++s) {
        net::envelope_reader r(out.pushes[s].msg);
        auto p = r.root().getPushGradient();
        CHECK(p.getShard() == s);
        CHECK(p.getStep() == static_cast<uint64_t>(k));
        const net::flat_view g = net::view(p.getValues(), "test");
        for (int64_t j = 0; j < g.numel; ++j)
          CHECK(g.data[j] == Approx((w0[g.offset + j] - wk[g.offset + j]) / lr).margin(1e-4));
      }
    }
  }
  CHECK_THROWS_MATCHES(local_steps(two_shards(), 0, lr, 0), troupe::error,
                       testing::message(Contains("--push-every must be at least 1")));
}

TEST_CASE("worker and shard: weights read in place, gradients written into a reused push, no copies",
          "[actors][worker][shard]") {
  model::model ref = tiny_model();
  auto rp = ref.parameters();
  std::vector<named_tensor> ts;
  for (auto* p : rp) ts.push_back({p->name, p->value.clone()});
  const model::param_layout layout = ref.layout();
  const train::shard_plan sp{shard_addr(0), model::plan_shards(layout, 1)[0], {worker_addr(0)}};
  shard_core shard(sp, ts, small_rule(model::algorithm_kind::asgd, 1, 0.1f), model::lr_schedule::constant, 100,
                   kernels::context{});
  shard_source_config c;
  c.self = worker_addr(0);
  c.layout = layout;
  c.shards = {sp};
  worker_core w(worker_plan_of(0), std::make_shared<replica_pool>(tiny_model), shard_weights(c));
  for (auto& pull : w.start()) {
    auto replies = shard.handle(pull.msg);
    REQUIRE(replies.size() == 1);
    CHECK(replies[0].to == worker_addr(0));
    w.on_params(replies[0].msg);
  }
  REQUIRE(w.ready());

  const tensor x = tiny_images();
  const net::message batch_msg = batch_message(x, tiny_labels);

  const float* push_at = nullptr;
  const float* params_at = nullptr;
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step);
    // The reference: the same step on a plain model, then plain SGD.
    reference_step(ref);
    worker_core::step_out out = w.step(batch_msg);
    REQUIRE(out.pushes.size() == 1);
    {
      net::envelope_reader r(out.pushes[0].msg);
      auto p = r.root().getPushGradient();
      CHECK(p.getBaseVersion() == static_cast<uint64_t>(step));
      CHECK(p.getStep() == static_cast<uint64_t>(step + 1));
      // Each step's gradient, not a sum of them.
      const net::flat_view g = net::view(p.getValues(), "test");
      for (unsigned t = 0; t < 2; ++t)
        for (int64_t j = 0; j < rp[t]->grad.numel(); ++j)
          CHECK(g.data[layout[t].offset + j] == Approx(rp[t]->grad.at(j)).margin(1e-6));
      if (push_at) CHECK(g.data == push_at);  // the shard let the last push go: the same buffer again
      push_at = g.data;
    }
    for (auto* p : rp) kernels::sgd_step(ctx, p->value, p->grad, 0.1f, 0.0f);
    net::message push = std::move(out.pushes[0].msg);
    out.pushes.clear();
    auto replies = shard.handle(push);
    push = net::message();
    const float* at = first_payload(replies.at(0).msg);
    if (params_at) CHECK(at == params_at);  // the worker let its Params go: updated in place
    params_at = at;
    w.on_params(replies[0].msg);
  }
  // The shard's parameters are the reference's after three SGD steps.
  auto snap = shard.snapshot();
  for (unsigned t = 0; t < 2; ++t)
    for (int64_t j = 0; j < rp[t]->value.numel(); ++j)
      CHECK(snap[t].value.at(j) == Approx(rp[t]->value.at(j)).margin(1e-6));
}

TEST_CASE("worker: with shard weights, the forward pass reads the Params payload, read-only", "[actors][worker]") {
  auto rec = std::make_shared<probe_record>();
  auto pool = std::make_shared<replica_pool>([rec] { return probed_model(rec); });
  model::model ref = probed_model(std::make_shared<probe_record>());
  const model::param_layout layout = ref.layout();
  REQUIRE(layout.size() == 3);
  CHECK(layout[2].name == "1.probe.b");
  CHECK(layout[2].offset == 8);

  shard_source_config c;
  c.self = worker_addr(0);
  c.layout = layout;
  c.shards = {{shard_addr(0), model::plan_shards(layout, 1)[0], {}, -1}};
  worker_core w(worker_plan_of(0), pool, shard_weights(c));
  // Weights other than the model's initial ones: the forward pass must read these.
  std::vector<float> wv{0.5f, -1, 0.25f, 1, 0, -0.5f, 0.1f, -0.2f, 0.75f};
  const net::message params =
      params_message(0, worker_addr(0), 0, 0, 0, {{shape{2, 3}, {wv.begin(), wv.begin() + 6}},
                                                   {shape{2}, {wv.begin() + 6, wv.begin() + 8}},
                                                   {shape{1}, {wv[8]}}});
  w.on_params(params);
  REQUIRE(w.ready());
  const worker_core::step_out out = w.step(batch_message(tiny_images(), tiny_labels));
  CHECK(rec->forwards == 1);
  CHECK(rec->read_only);
  CHECK(rec->at == first_payload(params) + 8);

  // The same loss as a plain model holding those weights.
  auto ps = ref.parameters();
  std::size_t k = 0;
  for (auto* p : ps)
    for (int64_t j = 0; j < p->value.numel(); ++j) p->value.at(j) = wv[k++];
  CHECK(out.loss == Approx(reference_step(ref)).epsilon(1e-5));

  // After the step the replica has its own parameters back: writable views of its flat buffers.
  replica* r = pool->acquire();
  CHECK(pool->size() == 1);
  auto rp = r->net.parameters();
  for (std::size_t i = 0; i < rp.size(); ++i) {
    INFO(rp[i]->name);
    CHECK_FALSE(rp[i]->value.read_only());
    CHECK(rp[i]->value.shares_storage(r->flat.values));
    CHECK(rp[i]->grad.shares_storage(r->flat.grads));
    CHECK(rp[i]->value.data() == r->flat.values.data() + layout[i].offset);
  }
  pool->release(r);
}

TEST_CASE("bound tensors view memory for one scope and give the slots their tensors back", "[actors][worker]") {
  tensor a = tensor::from({2}, {1, 2});
  tensor b = tensor::from({1}, {3});
  const tensor a_own = a, b_own = b;
  std::vector<float> mem{7, 8};
  const std::vector<float> ro{9};
  {
    bound_tensors bt;
    bt.bind(a, {2}, mem.data());
    bt.bind_read_only(b, {1}, ro.data());
    CHECK(a.data() == mem.data());
    a.at(1) = 80;
    CHECK(b.read_only());
    CHECK(static_cast<const tensor&>(b).data() == ro.data());
    CHECK_THROWS_AS(b.data(), troupe::error);
  }
  CHECK(mem[1] == 80.0f);
  CHECK(a.shares_storage(a_own));
  CHECK(b.shares_storage(b_own));
  CHECK(a.to_vector() == std::vector<float>{1, 2});
  CHECK_FALSE(b.read_only());
}

TEST_CASE("replica pool: replicas are flattened, reused, and made only when all are borrowed", "[actors][worker]") {
  replica_pool pool(tiny_model);
  replica* r1 = pool.acquire();
  replica* r2 = pool.acquire();
  CHECK(r1 != r2);
  CHECK(pool.size() == 2);
  CHECK(r1->flat.values.numel() == 8);
  CHECK(r1->net.parameters()[1]->value.data() == r1->flat.values.data() + 6);
  pool.release(r1);
  CHECK(pool.acquire() == r1);
  CHECK(pool.size() == 2);
  replica_pool unbuilt([] { return nn::sequential(nn::dense(3, 2)); });
  CHECK_THROWS_MATCHES(unbuilt.acquire(), troupe::error, testing::message(Contains("must return a built model")));
}

TEST_CASE("worker: Hogwild! workers step on one shared buffer, staleness counts updates in between",
          "[actors][worker][hogwild]") {
  const float lr = 0.1f;
  model::model ref = tiny_model();
  const std::vector<float> w0 = flat_values(ref);
  auto store = std::make_shared<hogwild_store>(w0.data(), static_cast<int64_t>(w0.size()));
  CHECK(store->size() == 8);

  SECTION("two workers' steps, one after the other, change the shared buffer") {
    auto pool = std::make_shared<replica_pool>(tiny_model);
    worker_core a(worker_plan_of(0), pool, hogwild_weights(store, lr, model::lr_schedule::constant, 100));
    worker_core b(worker_plan_of(1), pool, hogwild_weights(store, lr, model::lr_schedule::constant, 100));
    CHECK(a.start().empty());
    CHECK(a.ready());
    CHECK_THROWS_AS(a.on_params(weight_params(w0, 0)), net::message_error);
    const tensor xb = tensor::from({2, 3}, {0, 1, 1, -2, 0.5f, 0});
    const std::vector<int32_t> lb{0, 0};
    CHECK(a.step(batch_message(tiny_images(), tiny_labels)).pushes.empty());
    CHECK(b.step(batch_message(xb, lb, worker_addr(1))).pushes.empty());
    CHECK(store->updates.load() == 2u);

    // By hand: w1 = w0 - lr g_a(w0), w2 = w1 - lr g_b(w1).
    auto ps = ref.parameters();
    for (int i = 0; i < 2; ++i) {
      if (i == 0)
        reference_step(ref);
      else
        reference_step(ref, xb, lb);
      for (auto* p : ps) kernels::sgd_step(ctx, p->value, p->grad, lr, 0.0f);
    }
    std::vector<float> now(8);
    store->read(now.data());
    const std::vector<float> want = flat_values(ref);
    for (int j = 0; j < 8; ++j) CHECK(now[j] == Approx(want[j]).margin(1e-6));
    for (worker_core* wc : {&a, &b}) {
      REQUIRE(wc->report_due());
      const train::step_report r = wc->report();
      CHECK(r.step == 1u);
      CHECK(r.samples == 2u);
      CHECK(r.mean_staleness == 0.0);
      CHECK(r.max_staleness == 0u);
    }
  }

  SECTION("two steps at once: the second update is one update stale") {
    replica_pool pool(tiny_model);
    auto s0 = hogwild_weights(store, lr, model::lr_schedule::constant, 100);
    auto s1 = hogwild_weights(store, lr, model::lr_schedule::constant, 100);
    replica* r0 = pool.acquire();
    replica* r1 = pool.acquire();
    {
      bound_tensors b0, b1;
      s0->bind(*r0, b0);
      s1->bind(*r1, b1);
      CHECK(r0->flat.values.to_vector() == w0);
      CHECK(r1->flat.values.to_vector() == w0);
      r0->flat.grads.fill(1.0f);
      r1->flat.grads.fill(2.0f);
      std::vector<outgoing> out;
      s0->update(ctx, *r0, 1, out);
      s1->update(ctx, *r1, 1, out);
      CHECK(out.empty());
    }
    std::vector<float> now(8);
    store->read(now.data());
    for (int j = 0; j < 8; ++j) CHECK(now[j] == Approx(w0[j] - lr * 1.0f - lr * 2.0f).margin(1e-6));
    CHECK(store->updates.load() == 2u);
    REQUIRE(s1->report_due());
    const staleness_tally t1 = s1->take_tally();
    CHECK(t1.count == 1u);
    CHECK(t1.sum == 1u);
    CHECK(t1.max == 1u);
    CHECK(t1.rejected == 0u);
    CHECK_FALSE(s1->report_due());
    const staleness_tally t0 = s0->take_tally();
    CHECK(t0.count == 1u);
    CHECK(t0.sum == 0u);
    pool.release(r0);
    pool.release(r1);
  }
}

namespace {

/// dense(3, 2), relu, dense(2, 6) on two shards: shard 0 holds the first
/// dense layer's weight and bias (layer 0), shard 1 the second's (layer 2);
/// a batch of 2 samples.
struct two_layer_shards {
  static model::model make() {
    model::model m = nn::sequential(nn::dense(3, 2), nn::relu(), nn::dense(2, 6));
    m.build({3}, 7);
    return m;
  }
  model::model ref = make();
  model::param_layout layout = ref.layout();
  std::vector<model::shard_range> ranges = model::plan_shards(layout, 2);
  shard_source_config config;
  tensor x = tensor::empty({2, 3});

  two_layer_shards() {
    config.self = worker_addr(0);
    config.layout = layout;
    for (uint32_t s = 0; s < 2; ++s) config.shards.push_back({shard_addr(s), ranges[s], {worker_addr(0)}});
    for (int64_t i = 0; i < 6; ++i) x.at(i) = 0.1f * static_cast<float>(i) - 0.2f;
  }
  /// Two ASGD shards holding ref's parameters (as built: a reference step changes only its gradients).
  std::vector<std::unique_ptr<shard_core>> shards() {
    std::vector<std::unique_ptr<shard_core>> out;
    auto params = ref.parameters();
    for (uint32_t s = 0; s < 2; ++s) {
      std::vector<named_tensor> ts;
      for (uint32_t i = ranges[s].first; i < ranges[s].last; ++i)
        ts.push_back({params[i]->name, params[i]->value.clone()});
      out.push_back(std::make_unique<shard_core>(config.shards[s], ts, small_rule(model::algorithm_kind::asgd, 1, 0.1f),
                                                 model::lr_schedule::constant, 100, kernels::context{}));
    }
    return out;
  }
};

/// The gradient values a PushGradient carries.
std::vector<float> pushed_gradient(const net::message& m) {
  net::envelope_reader r(m);
  const net::flat_view g = net::view(r.root().getPushGradient().getValues(), "test");
  return std::vector<float>(g.data, g.data + g.numel);
}

} // namespace

TEST_CASE("worker: pipelined execution sends a shard's push as soon as backward has produced it",
          "[actors][worker][overlap]") {
  two_layer_shards t;
  const auto& ranges = t.ranges;
  REQUIRE(ranges[0].first == 0);
  REQUIRE(ranges[1].first == 2);  // the second dense layer's weight: layer 2
  // The same two steps linear (pushes after backward) and pipelined (a sender given).
  std::map<uint32_t, std::vector<float>> got[2][2];  // [pipelined][step] shard -> gradient
  for (int pipelined = 0; pipelined < 2; ++pipelined) {
    INFO((pipelined ? "pipelined" : "linear"));
    auto shards = t.shards();
    worker_core w(worker_plan_of(0), std::make_shared<replica_pool>(two_layer_shards::make), shard_weights(t.config));
    std::vector<outgoing> sent;
    if (pipelined) w.overlap([&](outgoing&& o) { sent.push_back(std::move(o)); });
    for (auto& pull : w.start()) w.on_params(shards[pull.to.index]->handle(pull.msg).at(0).msg);
    REQUIRE(w.ready());
    for (int step = 0; step < 2; ++step) {
      sent.clear();
      worker_core::step_out out = w.step(batch_message(t.x, tiny_labels));
      if (pipelined) {
        // Both pushes went out during backward, the last layer's shard first.
        CHECK(out.pushes.empty());
        CHECK(out.sent_during_backward == 2);
        REQUIRE(sent.size() == 2);
        CHECK(sent[0].to == shard_addr(1));
        CHECK(sent[1].to == shard_addr(0));
      } else {
        CHECK(out.sent_during_backward == 0);
        REQUIRE(out.pushes.size() == 2);
        sent = out.pushes;
      }
      CHECK_FALSE(w.ready());
      for (auto& o : sent) {
        got[pipelined][step][o.to.index] = pushed_gradient(o.msg);
        w.on_params(shards[o.to.index]->handle(o.msg).at(0).msg);
      }
      REQUIRE(w.ready());
    }
  }
  // The same gradients either way, step after step.
  for (int step = 0; step < 2; ++step)
    for (uint32_t s = 0; s < 2; ++s) {
      INFO("step " << step << ", shard " << s);
      REQUIRE(got[0][step][s].size() == static_cast<std::size_t>(ranges[s].numel()));
      CHECK(got[0][step][s] == got[1][step][s]);
    }
}

TEST_CASE("worker: receiving per layer, the forward pass runs a shard's layers as soon as its weights arrive",
          "[actors][worker][overlap]") {
  two_layer_shards t;
  REQUIRE(t.ranges[0].last == 2);
  const double ref_loss = reference_step(t.ref, t.x);
  const std::vector<float> ref_grads = flat_grads(t.ref);
  auto shards = t.shards();
  worker_core w(worker_plan_of(0), std::make_shared<replica_pool>(two_layer_shards::make), shard_weights(t.config));
  std::vector<outgoing> sent;
  w.overlap([&](outgoing&& o) { sent.push_back(std::move(o)); });
  const std::vector<outgoing> pulls = w.start();
  REQUIRE(pulls.size() == 2);
  CHECK_FALSE(w.can_step());
  // Only the first layer's shard has answered: the step starts, runs layers 0 and 1, and pauses at layer 2.
  w.on_params(shards[0]->handle(pulls[0].msg).at(0).msg);
  CHECK_FALSE(w.ready());
  REQUIRE(w.can_step());
  worker_core::step_out out = w.step(batch_message(t.x, tiny_labels));
  CHECK(out.paused);
  CHECK(w.paused());
  CHECK_FALSE(w.can_resume());
  CHECK_FALSE(w.can_step());
  CHECK(sent.empty());
  CHECK_THROWS_WITH(w.step(batch_message(t.x, tiny_labels)), Contains("while a step waits"));
  CHECK_THROWS_WITH(w.resume(), Contains("layer 2"));
  // A late duplicate for shard 0, other weights at another version: the paused step keeps the weights it began with.
  w.on_params(params_message(0, worker_addr(0), 99, 0, 0,
                             {{shape{2, 3}, std::vector<float>(6, 5.0f)}, {shape{2}, std::vector<float>(2, 5.0f)}}));
  w.on_params(shards[1]->handle(pulls[1].msg).at(0).msg);
  REQUIRE(w.can_resume());
  out = w.resume();
  CHECK_FALSE(out.paused);
  CHECK_FALSE(w.paused());
  CHECK(out.loss == Approx(ref_loss).epsilon(1e-6));
  // Both pushes went out during backward, the second layer's shard first, each with its shard's index as priority.
  REQUIRE(sent.size() == 2);
  std::vector<float> grads;
  for (int k : {1, 0}) {
    const outgoing& o = sent[static_cast<std::size_t>(1 - k)];
    CHECK(o.to == shard_addr(static_cast<uint32_t>(k)));
    CHECK(o.priority == k);
    net::envelope_reader r(o.msg);
    CHECK(r.root().getPushGradient().getBaseVersion() == 0);
  }
  for (int k : {0, 1}) {
    const std::vector<float> g = pushed_gradient(sent[static_cast<std::size_t>(1 - k)].msg);
    grads.insert(grads.end(), g.begin(), g.end());
  }
  REQUIRE(grads.size() == ref_grads.size());
  for (std::size_t i = 0; i < grads.size(); ++i) CHECK(grads[i] == Approx(ref_grads[i]).epsilon(1e-6));
}

TEST_CASE("worker: each Params and Batch is opened once, from its arrival to the step", "[actors][worker]") {
  model::model ref = tiny_model();
  const std::vector<float> w0 = flat_values(ref);
  worker_core w(worker_plan_of(0), std::make_shared<replica_pool>(tiny_model), shard_weights(two_shards()));
  w.start();
  const net::message weights = weight_params(w0, 0), bias = bias_params(w0, 0);
  const net::message batch = batch_message(tiny_images(), tiny_labels);
  const uint64_t before = net::messages_opened();
  w.on_params(weights);
  w.on_params(bias);
  REQUIRE(w.ready());
  const auto out = w.step(batch);
  CHECK(net::messages_opened() - before == 3);
  CHECK(out.pushes.size() == 2);
}
