// The sequential loop's AdamW: weight decay on weight matrices only.

#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include "kernels/context.hpp"
#include "model/optimizer.hpp"
#include "model/zoo.hpp"
#include "train/optimizers.hpp"

using namespace troupe;

TEST_CASE("adamw: weight decay on weight matrices, not on biases, norms or embeddings", "[optimizer]") {
  model::model m = zoo::gpt(12, 8, 16, 2, 1);
  m.build({8}, 3);
  const std::vector<model::parameter*> params = m.parameters();
  int decayed = 0, kept = 0;
  for (const model::parameter* p : params) {
    const bool embedding = p->name.find("embedding.") != std::string::npos;
    INFO(p->name);
    CHECK(train::decays(*p) == (p->value.rank() >= 2 && !embedding));
    if (embedding || p->name.find("layer_norm.") != std::string::npos || p->name.find(".bias") != std::string::npos)
      CHECK_FALSE(train::decays(*p));
    (train::decays(*p) ? decayed : kept) += 1;
  }
  CHECK(decayed > 0);
  CHECK(kept > 0);

  // Zero gradients: Adam's step is 0, so only the decay moves a parameter, by lr * wd * w.
  std::vector<tensor> before;
  for (model::parameter* p : params) {
    before.push_back(p->value.clone());
    p->grad = tensor::zeros(p->value.shape());
  }
  const float lr = 0.1f, wd = 0.5f;
  auto opt = train::make_adamw(lr, wd);
  opt->step(kernels::context{}, params);
  for (std::size_t i = 0; i < params.size(); ++i) {
    INFO(params[i]->name);
    const float factor = train::decays(*params[i]) ? 1.0f - lr * wd : 1.0f;
    for (int64_t j = 0; j < before[i].numel(); ++j)
      REQUIRE(params[i]->value.at(j) == Approx(factor * before[i].at(j)).margin(1e-7));
  }
}

TEST_CASE("lr schedule: linear warm-up, then the schedule over the steps after it", "[optimizer]") {
  using model::lr_schedule;
  using model::scheduled_lr;
  // No warm-up: as before.
  CHECK(scheduled_lr(1.0f, lr_schedule::cosine, 50, 100) == Approx(0.5));
  CHECK(scheduled_lr(1.0f, lr_schedule::constant, 99, 100) == 1.0f);
  // 10 steps of warm-up: base * (s + 1) / 10, then the cosine over the 100 steps after them.
  CHECK(scheduled_lr(2.0f, lr_schedule::cosine, 0, 110, 10) == Approx(0.2));
  CHECK(scheduled_lr(2.0f, lr_schedule::cosine, 4, 110, 10) == Approx(1.0));
  CHECK(scheduled_lr(2.0f, lr_schedule::cosine, 9, 110, 10) == Approx(2.0));
  CHECK(scheduled_lr(2.0f, lr_schedule::cosine, 10, 110, 10) == Approx(2.0));
  CHECK(scheduled_lr(2.0f, lr_schedule::cosine, 60, 110, 10) == Approx(1.0));
  CHECK(scheduled_lr(2.0f, lr_schedule::cosine, 110, 110, 10) == Approx(0.0).margin(1e-6));
  CHECK(scheduled_lr(2.0f, lr_schedule::constant, 60, 110, 10) == 2.0f);
  // A warm-up as long as the run: it climbs throughout.
  CHECK(scheduled_lr(1.0f, lr_schedule::cosine, 49, 100, 100) == Approx(0.5));
}

TEST_CASE("a step with a gradient missing names the parameter and changes nothing, in every optimizer", "[optimizer]") {
  const std::string which = GENERATE("sgd", "momentum", "adam", "adamw");
  std::unique_ptr<model::optimizer> opt = which == "sgd"        ? optim::sgd(0.1f).make()
                                          : which == "momentum" ? optim::sgd(0.1f).momentum(0.9f).make()
                                          : which == "adam"     ? optim::adam(0.1f).make()
                                                                : train::make_adamw(0.1f, 0.01f);
  model::parameter a{"0.dense.weight", tensor::from({2, 2}, {1, 2, 3, 4}), tensor::from({2, 2}, {1, 1, 1, 1})};
  model::parameter b{"0.dense.bias", tensor::from({2}, {5, 6}), tensor()};
  INFO(which);
  CHECK_THROWS_WITH(opt->step(kernels::context{}, {&a, &b}), Catch::Contains("0.dense.bias has no gradient"));
  CHECK(a.value.at(0) == 1.0f);
  CHECK(a.value.at(3) == 4.0f);
  // The step that failed counted nothing: after it, a whole step moves `a` as a first one does.
  b.grad = tensor::from({2}, {0, 0});
  opt->step(kernels::context{}, {&a, &b});
  if (which == "adam" || which == "adamw") CHECK(a.value.at(3) == Approx(4.0f - 0.1f - 0.1f * 0.01f * 4.0f * (which == "adamw")).epsilon(1e-5));
  else CHECK(a.value.at(3) == Approx(4.0f - 0.1f));
}
