// Where every role of a run starts (train/initial_state.hpp): a pure function
// of the checkpoint, the plan and the settings, tested without actors.
#include <catch2/catch.hpp>

#include "train/initial_state.hpp"

using namespace troupe;
using Catch::Matchers::Contains;

namespace {

/// A plan with `shards` shards of `each` parameters, or with the stages `stage_shards` (a stage's shard,
/// -1: it updates its own).
train::plan plan_with(int shards, std::vector<int> stage_shards = {}, int64_t each = 2) {
  train::plan p;
  for (int i = 0; i < shards; ++i)
    p.shards.push_back({{0, net::role::shard, static_cast<uint32_t>(i)},
                        {static_cast<uint32_t>(i), static_cast<uint32_t>(i + 1), i * each, (i + 1) * each},
                        {},
                        -1});
  for (std::size_t i = 0; i < stage_shards.size(); ++i) {
    train::stage_plan sp;
    sp.address = {0, net::role::stage, static_cast<uint32_t>(i)};
    sp.shard = stage_shards[i];
    p.stages.push_back(sp);
  }
  p.samples_per_epoch = 1000;
  return p;
}

settings with(algorithm_kind k, float momentum = 0.9f) {
  settings s;
  s.algo.kind = k;
  s.momentum = momentum;
  return s;
}

tensor filled(float v) { return tensor::from({2}, {v, v}); }

net::checkpoint two_shards() {
  net::checkpoint c;
  c.epoch = 3;
  c.step = 120;
  c.epoch_samples = 250;
  c.optimizer_kind = "dc-asgd-a";
  c.shard_versions = {40, 41};
  c.optimizer = {{"shard0/ms/0", filled(1)}, {"shard1/ms/0", filled(2)}, {"shard1/v", filled(3)}};
  return c;
}

} // namespace

TEST_CASE("initial state: a fresh run starts every holder at version 0 without state", "[train][resume]") {
  const train::initial_state st = train::fresh_start(plan_with(2, {-1, -1}));
  CHECK_FALSE(st.resuming);
  CHECK(st.first_epoch == 0);
  CHECK(st.epoch_samples == 0);
  REQUIRE(st.shards.size() == 2);
  REQUIRE(st.stages.size() == 2);
  for (const auto& h : st.shards) CHECK((h.version == 0 && h.state.empty() && h.fresh.empty() && !h.resumes()));
}

TEST_CASE("initial state: shards resume their version and their own rule state", "[train][resume]") {
  const train::initial_state st = train::resumed_start(two_shards(), plan_with(2), with(algorithm_kind::dc_asgd_a));
  CHECK(st.resuming);
  CHECK(st.first_epoch == 3);
  CHECK(st.first_steps == 120);
  CHECK(st.epoch_samples == 250);  // the loaders skip them
  REQUIRE(st.shards.size() == 2);
  CHECK(st.shards[0].version == 40);
  CHECK(st.shards[1].version == 41);
  REQUIRE(st.shards[0].state.size() == 1);
  CHECK(st.shards[0].state[0].name == "ms/0");  // the prefix taken off
  REQUIRE(st.shards[1].state.size() == 2);
  CHECK(st.shards[1].state[1].name == "v");
  CHECK(st.shards[1].state[1].value.data()[0] == 3.0f);
  CHECK(st.shards[1].resumes());
}

TEST_CASE("initial state: another algorithm or shard count starts the shards fresh, saying why", "[train][resume]") {
  const train::initial_state other = train::resumed_start(two_shards(), plan_with(2), with(algorithm_kind::asgd));
  CHECK_THAT(other.shards[0].fresh, Contains("written by 'dc-asgd-a', not asgd"));
  CHECK(other.shards[0].state.empty());
  CHECK(other.first_epoch == 3);  // the parameters and the position resume all the same
  // Three shards of 2 cannot be cut from two of 2: the states hold 4 values, the model 6.
  const train::initial_state three = train::resumed_start(two_shards(), plan_with(3), with(algorithm_kind::dc_asgd_a));
  REQUIRE(three.shards.size() == 3);
  CHECK_THAT(three.shards[2].fresh, Contains("the checkpoint has 2 shard(s), this run 3"));
  CHECK_THAT(three.shards[2].fresh, Contains("no state holds one value per parameter"));
  CHECK(three.shards[0].version == 0);
}

TEST_CASE("initial state: other shards of the same layout take their part of the old shards' state", "[train][resume]") {
  // Written cut by tensors: shard 0 held parameters [0, 3), shard 1 [3, 4); a per-parameter state v and a
  // scalar (DDC-ASGD v2's tau_bar) each.
  net::checkpoint c;
  c.optimizer_kind = "ddc-asgd";
  c.shard_versions = {50, 70};
  c.optimizer = {{"shard0/v", tensor::from({3}, {1, 2, 3})}, {"shard0/tau_bar", tensor::from({1}, {0.5f})},
                 {"shard1/v", tensor::from({1}, {4})}, {"shard1/tau_bar", tensor::from({1}, {0.75f})}};
  // Resumed cut evenly, two shards of 2.
  const train::initial_state even = train::resumed_start(c, plan_with(2), with(algorithm_kind::ddc_asgd));
  REQUIRE(even.shards.size() == 2);
  for (const auto& h : even.shards) {
    CHECK(h.resumes());
    CHECK_THAT(h.recut, Contains("the checkpoint has 2 shard(s), this run 2 cut otherwise"));
  }
  auto state = [](const train::holder_start& h, const std::string& name) {
    for (const auto& t : h.state)
      if (t.name == name) return std::vector<float>(t.value.data(), t.value.data() + t.value.numel());
    return std::vector<float>{};
  };
  CHECK(state(even.shards[0], "v") == std::vector<float>{1, 2});
  CHECK(state(even.shards[1], "v") == std::vector<float>{3, 4});
  // Shard 0 overlaps old shard 0 only; shard 1 both, and takes the newer one's version and scalar.
  CHECK(even.shards[0].version == 50);
  CHECK(state(even.shards[0], "tau_bar") == std::vector<float>{0.5f});
  CHECK(even.shards[1].version == 70);
  CHECK(state(even.shards[1], "tau_bar") == std::vector<float>{0.75f});
  // Four shards of one parameter each.
  const train::initial_state four = train::resumed_start(c, plan_with(4, {}, 1), with(algorithm_kind::ddc_asgd));
  REQUIRE(four.shards.size() == 4);
  CHECK(state(four.shards[2], "v") == std::vector<float>{3});
  CHECK(state(four.shards[3], "v") == std::vector<float>{4});
  CHECK(four.shards[3].version == 70);
  // A state that is neither: the shard starts fresh, saying which.
  c.optimizer.push_back({"shard0/odd", tensor::from({2}, {1, 1})});
  c.optimizer.push_back({"shard1/odd", tensor::from({3}, {1, 1, 1})});
  const train::initial_state odd = train::resumed_start(c, plan_with(2), with(algorithm_kind::ddc_asgd));
  CHECK_THAT(odd.shards[0].fresh, Contains("its state 'odd' is neither one value per parameter nor one value"));
  CHECK(odd.shards[0].state.empty());
}

TEST_CASE("initial state: a position past the data set's end starts that epoch over", "[train][resume]") {
  net::checkpoint c = two_shards();
  c.epoch_samples = 1000;  // the plan's epoch has 1000 samples
  const train::initial_state st = train::resumed_start(c, plan_with(2), with(algorithm_kind::dc_asgd_a));
  CHECK(st.epoch_samples == 0);
  CHECK(st.epoch_samples_dropped == 1000);
}

TEST_CASE("initial state: stages that update their own parameters resume their momentum", "[train][resume]") {
  net::checkpoint c;
  c.optimizer_kind = "sequential";
  c.shard_versions = {0, 0, 0};
  c.optimizer = {{"shard0/velocity", filled(5)}, {"shard2/velocity", filled(7)}};
  const train::initial_state st = train::resumed_start(c, plan_with(0, {-1, -1, -1}), with(algorithm_kind::sequential));
  REQUIRE(st.stages.size() == 3);
  REQUIRE(st.stages[0].resumes());
  CHECK(st.stages[0].state[0].name == "velocity");
  CHECK(st.stages[2].state[0].value.data()[1] == 7.0f);
  // Stage 1 has parameters without momentum in the checkpoint: fresh, and said so (with momentum on).
  CHECK_FALSE(st.stages[1].resumes());
  CHECK_THAT(st.stages[1].fresh, Contains("holds no velocity for it"));
  const train::initial_state plain =
      train::resumed_start(c, plan_with(0, {-1, -1, -1}), with(algorithm_kind::sequential, 0.0f));
  CHECK(plain.stages[1].fresh.empty());  // no momentum: nothing to say

  // Another layout (a stage count the checkpoint's holders do not match): every stage fresh.
  const train::initial_state other = train::resumed_start(c, plan_with(0, {-1, -1}), with(algorithm_kind::sequential));
  CHECK_THAT(other.stages[0].fresh, Contains("3 parameter holder(s), this run 2 stages"));
  // A hybrid's stages: their shard holds the state; the stage itself starts without one.
  const train::initial_state hybrid = train::resumed_start(c, plan_with(0, {0, 0, 0}), with(algorithm_kind::sequential));
  CHECK((hybrid.stages[0].fresh.empty() && hybrid.stages[0].state.empty()));
}
