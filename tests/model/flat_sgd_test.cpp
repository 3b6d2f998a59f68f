// The optimizer of flat parameters (a stage's, an allreduce replica's).

#include <catch2/catch.hpp>

#include <vector>

#include "model/flat_sgd.hpp"
#include "tensor/error.hpp"

using namespace troupe;

TEST_CASE("flat_sgd: momentum steps on the scheduled lr, clipping, state and its restore", "[optimizer]") {
  model::flat_sgd_options o;
  o.lr = 0.5f;
  o.momentum = 0.5f;
  o.warmup_steps = 2;  // step 0 at lr 0.25, step 1 at 0.5
  model::flat_sgd opt(o, 2);
  std::vector<float> w{1, 2}, g{1, -1};
  opt.step(kernels::context{}, w.data(), g.data(), 0);  // v = g, w -= 0.25 * v
  CHECK(w[0] == Approx(0.75));
  CHECK(w[1] == Approx(2.25));
  g = {1, -1};
  opt.step(kernels::context{}, w.data(), g.data(), 1);  // v = 0.5 v + g = 1.5 g, w -= 0.5 * v
  CHECK(w[0] == Approx(0.0));
  CHECK(w[1] == Approx(3.0));
  CHECK(opt.velocity() == std::vector<float>{1.5f, -1.5f});
  CHECK(opt.has_state());

  // Clipped to norm 1 first: (3, 4) becomes (0.6, 0.8); no momentum, no state.
  model::flat_sgd_options c;
  c.lr = 1;
  c.momentum = 0;
  c.clip_grad_norm = 1;
  model::flat_sgd clip(c, 2);
  std::vector<float> w2{0, 0}, g2{3, 4};
  clip.step(kernels::context{}, w2.data(), g2.data(), 0);
  CHECK(w2[0] == Approx(-0.6));
  CHECK(w2[1] == Approx(-0.8));
  CHECK_FALSE(clip.has_state());

  const std::vector<float> saved{7, 8};
  opt.restore(saved.data(), 2, "stage 1");
  CHECK(opt.velocity() == saved);
  CHECK_THROWS_WITH(opt.restore(saved.data(), 1, "stage 1"),
                    Catch::Matchers::Contains("stage 1: the checkpoint's velocity has 1 values, 2 expected"));
}
