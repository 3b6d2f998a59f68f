// The parameter server's update rules against hand-computed values.
#include <catch2/catch.hpp>

#include <random>

#include "model/update_rule.hpp"
#include "tensor/error.hpp"
#include "tests/test_util.hpp"

using namespace troupe::model;
using Catch::Contains;

namespace {
/// The rule named `name` as the command line names it.
algorithm_kind named(const std::string& name) {
  for (algorithm_kind k : all_algorithms())
    if (name == to_string(k) && traits(k).make) return k;
  FAIL("no rule named " << name);
  return algorithm_kind::asgd;
}

update_config cfg(const std::string& rule, int workers = 1) {
  update_config c;
  c.rule = named(rule);
  c.lr = 0.1f;
  c.workers = workers;
  return c;
}
} // namespace

TEST_CASE("ASGD and staleness-aware ASGD", "[model][rules]") {
  std::vector<float> w{1.0f, 2.0f}, g{0.5f, -1.0f};
  auto asgd = make_update_rule(cfg("asgd"), 2);
  CHECK(asgd->apply(w.data(), g.data(), 2, 0, 7));
  CHECK(w[0] == Approx(0.95));
  CHECK(w[1] == Approx(2.1));

  w = {1.0f, 2.0f};
  auto sa = make_update_rule(cfg("sa-asgd"), 2);
  sa->apply(w.data(), g.data(), 2, 0, 4);  // eta / 4
  CHECK(w[0] == Approx(1.0 - 0.025 * 0.5));
  CHECK(w[1] == Approx(2.0 + 0.025));
  sa->apply(w.data(), g.data(), 2, 0, 0);  // eta / max(1, 0) = eta
  CHECK(w[0] == Approx(1.0 - 0.0125 - 0.05));
}

TEST_CASE("SSGD applies the mean once every worker has sent", "[model][rules]") {
  std::vector<float> w{1.0f}, g1{1.0f}, g2{3.0f};
  auto r = make_update_rule(cfg("ssgd", 2), 1);
  CHECK_FALSE(r->apply(w.data(), g1.data(), 1, 0, 0));
  CHECK(w[0] == 1.0f);
  CHECK_THROWS_WITH(r->apply(w.data(), g1.data(), 1, 0, 0), Contains("two gradients in one round"));
  CHECK(r->apply(w.data(), g2.data(), 1, 1, 0));
  CHECK(w[0] == Approx(1.0 - 0.1 * 2.0));
  // The next round starts empty.
  CHECK_FALSE(r->apply(w.data(), g2.data(), 1, 1, 0));
}

TEST_CASE("DC-ASGD-c compensates with lambda g*g*(w - w_bak)", "[model][rules]") {
  auto c = cfg("dc-asgd-c", 2);
  c.lambda = 0.5f;
  auto r = make_update_rule(c, 1);
  std::vector<float> w{0.5f}, g{2.0f};
  r->on_send(w.data(), 1, 0);  // worker 0 received w = 0.5
  w[0] = 1.0f;                  // others moved w since
  r->apply(w.data(), g.data(), 1, 0, 3);
  CHECK(w[0] == Approx(1.0 - 0.1 * (2.0 + 0.5 * 4.0 * 0.5)));  // 0.7; w_bak(0) = 0.7
  w[0] = 0.9f;
  g[0] = 1.0f;
  r->apply(w.data(), g.data(), 1, 0, 1);
  CHECK(w[0] == Approx(0.9 - 0.1 * (1.0 + 0.5 * 1.0 * 0.2)));
  // Worker 1 never pulled: w_bak(1) = w, no compensation.
  w[0] = 1.0f;
  r->apply(w.data(), g.data(), 1, 1, 0);
  CHECK(w[0] == Approx(0.9));
}

TEST_CASE("DC-ASGD-a adapts lambda from the worker's mean square", "[model][rules]") {
  auto c = cfg("dc-asgd-a");
  c.lambda0 = 2.0f;
  c.rho_ms = 0.5f;
  auto r = make_update_rule(c, 1);
  std::vector<float> w{0.5f}, g{2.0f};
  r->on_send(w.data(), 1, 0);
  w[0] = 1.0f;
  r->apply(w.data(), g.data(), 1, 0, 2);
  const double ms = 0.5 * 4.0, lambda = 2.0 / std::sqrt(ms + 1e-7);
  CHECK(w[0] == Approx(1.0 - 0.1 * (2.0 + lambda * 4.0 * 0.5)).epsilon(1e-5));
}

TEST_CASE("DDC-ASGD: rho and mu from each message's staleness", "[model][rules]") {
  CHECK(ddc_rho(0.5f, 0) == 1.0f);
  CHECK(ddc_rho(0.5f, 4) == Approx(1.0 / 3.0));
  CHECK(ddc_mu(0.9f, 0) == Approx(0.9));
  CHECK(ddc_mu(0.9f, 2) == Approx(0.7));
  CHECK(ddc_mu(0.9f, 9) == 0.0f);
  CHECK(ddc_mu(0.9f, 50) == 0.0f);

  auto c = cfg("ddc-asgd");
  c.lambda0 = 2.0f;
  c.rho_ms = 0.5f;
  c.alpha = 0.5f;
  c.mu0 = 0.9f;
  auto r = make_update_rule(c, 1);
  std::vector<float> w{0.5f}, g{2.0f};
  r->on_send(w.data(), 1, 0);
  w[0] = 1.0f;
  // Step 1, tau = 2: rho = 0.5, mu = 0.7, v = 0.5 * g_hat.
  r->apply(w.data(), g.data(), 1, 0, 2);
  const double g_hat = 2.0 + 2.0 / std::sqrt(2.0 + 1e-7) * 4.0 * 0.5;
  const double v1 = 0.5 * g_hat, w1 = 1.0 - 0.1 * v1;
  CHECK(w[0] == Approx(w1).epsilon(1e-5));
  // Step 2, tau = 0, w unchanged since worker 0's last update: g_hat = g.
  g[0] = 1.0f;
  r->apply(w.data(), g.data(), 1, 0, 0);
  const double v2 = 0.9 * v1 + 1.0 * 1.0;
  CHECK(w[0] == Approx(w1 - 0.1 * v2).epsilon(1e-5));
}

TEST_CASE("DDC-ASGD v2: rho from excess staleness, momentum topped up to mu0", "[model][rules]") {
  // Only staleness above the running mean is distrusted.
  CHECK(ddc2_rho(0.5f, 3, 3.0f) == 1.0f);
  CHECK(ddc2_rho(0.5f, 1, 3.0f) == 1.0f);
  CHECK(ddc2_rho(0.5f, 7, 3.0f) == Approx(1.0 / 3.0));
  // Asynchrony with mean staleness tau_bar implies momentum tau_bar / (1 + tau_bar).
  CHECK(ddc2_mu(0.9f, 0.0f) == Approx(0.9));
  CHECK(ddc2_mu(0.9f, 3.0f) == Approx(0.15));
  CHECK(ddc2_mu(0.9f, 15.0f) == 0.0f);

  auto c = cfg("ddc-asgd");
  c.ddc_version = 2;
  c.lambda0 = 0.0f;  // no compensation: the test follows rho, mu and tau_bar
  c.alpha = 0.5f;
  c.mu0 = 0.9f;
  c.tau_decay = 0.5f;
  auto r = make_update_rule(c, 1);
  CHECK(r->name() == "ddc-asgd-v2");
  std::vector<float> w{1.0f}, g{1.0f};
  r->on_send(w.data(), 1, 0);
  // Message 1, tau = 3: tau_bar starts at 3, rho = 1, mu = 0.9 - 0.75 = 0.15, v = 1; tau_bar stays 3.
  r->apply(w.data(), g.data(), 1, 0, 3);
  double v = 1.0, x = 1.0 - 0.1 * v;
  CHECK(w[0] == Approx(x).epsilon(1e-6));
  // Message 2, tau = 7: rho = 1 / (1 + 0.5 * 4) = 1/3, mu = 0.15; then tau_bar = 0.5 * 3 + 0.5 * 7 = 5.
  r->apply(w.data(), g.data(), 1, 0, 7);
  v = 0.15 * v + 1.0 / 3.0;
  x -= 0.1 * v;
  CHECK(w[0] == Approx(x).epsilon(1e-6));
  // Message 3, tau = 1: rho = 1, mu = max(0, 0.9 - 5/6) = 1/15.
  r->apply(w.data(), g.data(), 1, 0, 1);
  v = v / 15.0 + 1.0;
  x -= 0.1 * v;
  CHECK(w[0] == Approx(x).epsilon(1e-6));
  // The running mean is part of the rule's state: a restored rule continues the same.
  const auto st = r->state();
  auto r2 = make_update_rule(c, 1);
  r2->load_state(st);
  std::vector<float> w2 = w;
  r->on_send(w.data(), 1, 0);
  r2->on_send(w2.data(), 1, 0);
  r->apply(w.data(), g.data(), 1, 0, 9);
  r2->apply(w2.data(), g.data(), 1, 0, 9);
  CHECK(w2[0] == w[0]);
  // Version 1 is still selectable and unchanged.
  auto v1 = cfg("ddc-asgd");
  CHECK(make_update_rule(v1, 1)->name() == "ddc-asgd");
  v1.ddc_version = 3;
  CHECK_THROWS_WITH(make_update_rule(v1, 1), Contains("ddc version must be 1 or 2"));
}

TEST_CASE("DDC-ASGD with alpha = 0 and mu0 = 0 is DC-ASGD-a", "[model][rules]") {
  auto a = cfg("dc-asgd-a", 3), d = cfg("ddc-asgd", 3);
  d.alpha = 0.0f;
  d.mu0 = 0.0f;
  const int64_t n = 5;
  auto ra = make_update_rule(a, n), rd = make_update_rule(d, n);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> wa(n), wd(n), g(n);
  for (auto& x : wa) x = u(rng);
  wd = wa;
  for (int m = 0; m < 3; ++m) {
    ra->on_send(wa.data(), n, m);
    rd->on_send(wd.data(), n, m);
  }
  for (int step = 0; step < 12; ++step) {
    for (auto& x : g) x = u(rng);
    const int m = step % 3;
    ra->apply(wa.data(), g.data(), n, m, step % 4);
    rd->apply(wd.data(), g.data(), n, m, step % 4);
  }
  for (int64_t i = 0; i < n; ++i) CHECK(wd[i] == Approx(wa[i]).epsilon(1e-6));
}

TEST_CASE("a rule's state restores: a restored DDC-ASGD continues bit for bit", "[model][rules]") {
  auto c = cfg("ddc-asgd", 2);
  const int64_t n = 4;
  auto a = make_update_rule(c, n);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> w(n), g(n);
  for (auto& x : w) x = u(rng);
  auto step = [&](update_rule& r, std::vector<float>& wv, int m, int64_t tau) {
    for (auto& x : g) x = u(rng);
    r.apply(wv.data(), g.data(), n, m, tau);
  };
  for (int i = 0; i < 6; ++i) step(*a, w, i % 2, i % 3);
  auto s = a->state();
  REQUIRE(s.size() == 3);  // v, ms/0, ms/1
  CHECK(s[0].name == "v");
  CHECK(s[2].name == "ms/1");
  auto b = make_update_rule(c, n);
  b->load_state(s);
  // w_bak is not state: both learn it from the worker's next pull.
  std::vector<float> wb = w;
  for (int m = 0; m < 2; ++m) {
    a->on_send(w.data(), n, m);
    b->on_send(wb.data(), n, m);
  }
  const auto seed_state = rng;
  for (int i = 0; i < 4; ++i) step(*a, w, i % 2, i);
  rng = seed_state;
  for (int i = 0; i < 4; ++i) step(*b, wb, i % 2, i);
  CHECK(w == wb);
  // Without the state (a fresh rule) the same steps go elsewhere.
  auto fresh = make_update_rule(c, n);
  std::vector<float> wf = wb;
  fresh->on_send(wf.data(), n, 0);
  rng = seed_state;
  step(*a, w, 0, 0);
  rng = seed_state;
  step(*fresh, wf, 0, 0);
  CHECK(w != wf);
}

TEST_CASE("a state that does not fit is refused and changes nothing", "[model][rules]") {
  auto c = cfg("ddc-asgd", 2);
  auto r = make_update_rule(c, 3);
  std::vector<float> w{1, 2, 3}, g{1, 1, 1};
  r->apply(w.data(), g.data(), 3, 0, 0);
  const auto before = r->state();
  std::vector<troupe::named_tensor> bad{{"v", troupe::tensor::from({3}, {9, 9, 9})},
                                        {"ms/2", troupe::tensor::from({3}, {1, 1, 1})}};
  CHECK_THROWS_MATCHES(r->load_state(bad), troupe::error, troupe::testing::message(Contains("unexpected entry 'ms/2'")));
  bad = {{"v", troupe::tensor::from({2}, {9, 9})}};
  CHECK_THROWS_MATCHES(r->load_state(bad), troupe::error, troupe::testing::message(Contains("holds 2 values, the shard has 3")));
  const auto after = r->state();
  for (std::size_t i = 0; i < before.size(); ++i)
    for (int64_t j = 0; j < 3; ++j) CHECK(after[i].value.data()[j] == before[i].value.data()[j]);
  // Rules without state refuse any.
  auto asgd = make_update_rule(cfg("asgd"), 3);
  CHECK(asgd->state().empty());
  CHECK_THROWS_MATCHES(asgd->load_state(before), troupe::error, troupe::testing::message(Contains("asgd keeps no state")));
  CHECK(make_update_rule(cfg("dc-asgd-a", 2), 3)->state().size() == 2);
  CHECK(make_update_rule(cfg("dc-asgd-c", 2), 3)->state().empty());
}

TEST_CASE("update rule configuration errors", "[model][rules]") {
  auto c = cfg("ddc-asgd");
  c.mu0 = 1.0f;
  CHECK_THROWS_WITH(make_update_rule(c, 1), Contains("mu0"));
  c = cfg("asgd", 0);
  CHECK_THROWS_WITH(make_update_rule(c, 1), Contains("workers"));
  auto r = make_update_rule(cfg("asgd", 2), 1);
  std::vector<float> w{0}, g{0};
  CHECK_THROWS_WITH(r->apply(w.data(), g.data(), 1, 2, 0), Contains("worker id 2"));
}

TEST_CASE("staleness statistics", "[model][rules]") {
  staleness_stats s(2);
  s.record(0, 0);
  s.record(0, 2);
  s.record(1, 4);
  s.record(1, 100);
  CHECK(s.count() == 4);
  CHECK(s.mean() == Approx(26.5));
  CHECK(s.max() == 100);
  CHECK(s.worker_mean(0) == Approx(1.0));
  CHECK(s.worker_mean(1) == Approx(52.0));
  CHECK(s.histogram()[2] == 1);
  CHECK(s.histogram().back() == 1);  // >= 63
  staleness_stats t(2);
  t.record(0, 2);
  s.merge(t);
  CHECK(s.count() == 5);
  CHECK(s.histogram()[2] == 2);
  CHECK_THROWS_WITH(s.record(0, -1), Contains("negative"));
}

TEST_CASE("update rules: every algorithm with shards has a rule, the others none", "[model][rules]") {
  int rules = 0;
  for (algorithm_kind k : all_algorithms()) {
    INFO(to_string(k));
    update_config c;
    c.rule = k;
    if (traits(k).shards) {
      CHECK(make_update_rule(c, 3) != nullptr);
      ++rules;
    } else {
      CHECK_THROWS_WITH(make_update_rule(c, 3), Contains("has no parameter-server update rule"));
    }
  }
  CHECK(rules == 6);
}

TEST_CASE("ASGD with AdamW: the first step moves each weight by lr, decay on its segments only, state round-trips",
          "[model][rules]") {
  update_config c;
  c.rule = algorithm_kind::asgd;
  c.lr = 0.1f;
  c.adamw = true;
  c.weight_decay = 0.5f;
  c.segments = {2, 1};
  c.segment_decays = {true, false};
  auto rule = make_update_rule(c, 3);
  CHECK(rule->name() == "asgd+adamw");
  std::vector<float> w{1, 1, 1};
  const std::vector<float> g{2, -3, 4};
  rule->apply(w.data(), g.data(), 3, 0, 0);
  // Step 1: m_hat = g, v_hat = g*g, so the step is lr * sign(g) (eps aside), plus lr * wd * w where it decays.
  CHECK(w[0] == Approx(1 - 0.1f - 0.1f * 0.5f).epsilon(1e-5));
  CHECK(w[1] == Approx(1 + 0.1f - 0.1f * 0.5f).epsilon(1e-5));
  CHECK(w[2] == Approx(1 - 0.1f).epsilon(1e-5));
  auto again = make_update_rule(c, 3);
  again->load_state(rule->state());
  std::vector<float> w2 = w;
  rule->apply(w.data(), g.data(), 3, 0, 0);
  again->apply(w2.data(), g.data(), 3, 0, 0);
  CHECK(w == w2);
  CHECK_THROWS_WITH(again->load_state({{"adamw.m", troupe::tensor::zeros({2})}}), Contains("holds 2 values, not 3"));
  c.rule = algorithm_kind::dc_asgd_a;
  CHECK_THROWS_WITH(make_update_rule(c, 3), Contains("defined on SGD steps, not AdamW"));
}
