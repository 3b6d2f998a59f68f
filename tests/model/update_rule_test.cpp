// The parameter server's update rules against hand-computed values.
#include <catch2/catch.hpp>

#include <random>

#include "model/update_rule.hpp"
#include "tensor/error.hpp"

using namespace troupe::model;
using Catch::Contains;

namespace {
update_config cfg(const std::string& rule, int workers = 1) {
  update_config c;
  c.rule = rule;
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

TEST_CASE("update rule configuration errors", "[model][rules]") {
  CHECK_THROWS_WITH(make_update_rule(cfg("adagrad"), 1), Contains("unknown update rule 'adagrad'"));
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
