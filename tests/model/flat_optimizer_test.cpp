// The optimizer of flat parameters (a stage's, an allreduce replica's).

#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "model/flat_optimizer.hpp"
#include "tensor/error.hpp"

using namespace troupe;

TEST_CASE("flat_optimizer: momentum steps on the scheduled lr, clipping, state and its restore", "[optimizer]") {
  model::flat_optimizer_options o;
  o.lr = 0.5f;
  o.momentum = 0.5f;
  o.warmup_steps = 2;  // step 0 at lr 0.25, step 1 at 0.5
  model::flat_optimizer opt(o, 2);
  std::vector<float> w{1, 2}, g{1, -1};
  opt.step(kernels::context{}, w.data(), g.data(), 0);  // v = g, w -= 0.25 * v
  CHECK(w[0] == Approx(0.75));
  CHECK(w[1] == Approx(2.25));
  g = {1, -1};
  opt.step(kernels::context{}, w.data(), g.data(), 1);  // v = 0.5 v + g = 1.5 g, w -= 0.5 * v
  CHECK(w[0] == Approx(0.0));
  CHECK(w[1] == Approx(3.0));
  CHECK(opt.state() == std::vector<float>{1.5f, -1.5f});
  CHECK(opt.has_state());

  // Clipped to norm 1 first: (3, 4) becomes (0.6, 0.8); no momentum, no state.
  model::flat_optimizer_options c;
  c.lr = 1;
  c.momentum = 0;
  c.clip_grad_norm = 1;
  model::flat_optimizer clip(c, 2);
  std::vector<float> w2{0, 0}, g2{3, 4};
  clip.step(kernels::context{}, w2.data(), g2.data(), 0);
  CHECK(w2[0] == Approx(-0.6));
  CHECK(w2[1] == Approx(-0.8));
  CHECK_FALSE(clip.has_state());

  const std::vector<float> saved{7, 8};
  opt.restore(saved.data(), 2, "stage 1");
  CHECK(opt.state() == saved);
  CHECK_THROWS_WITH(opt.restore(saved.data(), 1, "stage 1"),
                    Catch::Matchers::Contains("stage 1: the checkpoint's velocity has 1 values, 2 expected"));
}

TEST_CASE("flat_optimizer: AdamW by segments, decay on those that decay, bias correction from the step given, state",
          "[optimizer]") {
  model::flat_optimizer_options o;
  o.adamw = true;
  o.lr = 0.1f;
  o.weight_decay = 0.5f;
  o.segments = {2, 1};
  o.segment_decays = {true, false};
  model::flat_optimizer opt(o, 3);
  CHECK(opt.has_state());
  CHECK(std::string(opt.state_name()) == "adamw.moments");
  CHECK(opt.state().size() == 6);  // m, then v
  std::vector<float> w{1, 2, 3}, g{1, -1, 2};
  opt.step(kernels::context{}, w.data(), g.data(), 0);  // t = 1: the step is lr * sign(g), plus lr * wd * w where it decays
  CHECK(w[0] == Approx(1 - 0.1 * (1 + 0.5 * 1)).epsilon(1e-5));
  CHECK(w[1] == Approx(2 - 0.1 * (-1 + 0.5 * 2)).margin(1e-5));
  CHECK(w[2] == Approx(3 - 0.1 * 1).epsilon(1e-5));
  CHECK(opt.state()[0] == Approx(0.1));     // m = (1 - beta1) g
  CHECK(opt.state()[2] == Approx(0.2));
  CHECK(opt.state()[3 + 2] == Approx(0.004).epsilon(1e-4));  // v = (1 - beta2) g^2

  // A fresh optimizer given step 4 (a resumed run's global step) corrects as at t = 5.
  o.weight_decay = 0;
  model::flat_optimizer later(o, 3);
  std::vector<float> w2{0, 0, 0}, g2{1, -1, 2};
  later.step(kernels::context{}, w2.data(), g2.data(), 4);
  const double m_hat = 0.1 / (1 - std::pow(0.9, 5)), v_hat = 0.001 / (1 - std::pow(0.999, 5));
  CHECK(w2[0] == Approx(-0.1 * m_hat / std::sqrt(v_hat)).epsilon(1e-4));

  const std::vector<float> saved{1, 2, 3, 4, 5, 6};
  later.restore(saved.data(), 6, "allreduce");
  CHECK(later.state() == saved);
  CHECK_THROWS_WITH(later.restore(saved.data(), 3, "allreduce"),
                    Catch::Matchers::Contains("allreduce: the checkpoint's adamw.moments has 3 values, 6 expected"));
  o.segments = {2, 2};
  CHECK_THROWS_WITH(model::flat_optimizer(o, 3), Catch::Matchers::Contains("segments of 4 values for a range of 3"));
}
