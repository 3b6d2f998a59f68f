// A pipeline's stages placed on devices by the plan: the placer's cuts and
// devices, the emulated slowdown of each stage, the estimate, the errors.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <set>

#include "tests/test_util.hpp"
#include "model/cost_profile.hpp"
#include "train/plan.hpp"

using namespace troupe;
using namespace troupe::train;
using Catch::Matchers::Contains;

namespace {

/// Four layers of one tensor each (6, 2, 8 and 2 elements).
model::param_layout four_tensors() {
  return model::param_layout({{"w0", {2, 3}}, {"b0", {2}}, {"w1", {2, 4}}, {"b1", {2}}});
}

model::model::layer_profile four_layers() {
  model::model::layer_profile p;
  p.tensors = {1, 1, 1, 1};
  p.costs = {10, 40, 20, 30};
  p.param_bytes = {24, 8, 32, 8};
  p.output_elems = {100, 50, 20, 10};
  return p;
}

/// Measured costs, per mini-batch, on this machine (the fastest device).
std::vector<model::layer_cost> measured() {
  return {{0.001, 0.002, 24, 400}, {0.004, 0.008, 8, 200}, {0.002, 0.004, 32, 80}, {0.003, 0.006, 8, 40}};
}

settings pipeline(int stages, placement_kind how, std::vector<float> speeds) {
  settings s;
  s.batch_size = 8;
  s.pipeline.stages = stages;
  s.pipeline.micro_batches = 2;
  s.pipeline.placement = how;
  s.pipeline.device_speeds = std::move(speeds);
  return s;
}

} // namespace

TEST_CASE("plan: a placer puts the stages on distinct devices and slows each as its device", "[train][plan]") {
  const auto profile = four_layers();
  const auto costs = measured();
  for (placement_kind how : {placement_kind::greedy, placement_kind::optimal, placement_kind::random}) {
    INFO(to_string(how));
    const settings s = pipeline(3, how, {1, 2, 4, 1});
    const plan p = make_plan(s, topology::local(2), four_tensors(), 100, &profile, &costs);
    REQUIRE(p.stages.size() == 3);
    REQUIRE(p.devices.size() == 4);
    std::set<int> used;
    std::size_t next = 0;
    for (const auto& st : p.stages) {
      CHECK(st.first_layer == next);
      CHECK(st.last_layer > st.first_layer);
      next = st.last_layer;
      used.insert(st.device);
      // 3 stages on a node of 2 threads: the fastest device (4) is emulated 1.5x slower than a stage alone here.
      CHECK(st.slowdown == Approx(6.0 / p.devices[st.device].speed));
    }
    // An emulated device's action lasts its stage's estimated time per micro-batch (M = 2).
    for (std::size_t k = 0; k < p.stages.size(); ++k) {
      CHECK(p.stages[k].fwd_action_s == Approx(p.estimate.stages[k].fwd_s / 2));
      CHECK(p.stages[k].bwd_action_s == Approx(p.estimate.stages[k].bwd_s / 2));
      CHECK(p.stages[k].fwd_action_s > 0);
    }
    CHECK(next == 4);
    CHECK(used.size() == 3);
    // The estimate is the cost model's for this placement, with costs at speed 1 = measured x the fastest
    // speed x the stages sharing a thread (1.5).
    std::vector<model::layer_cost> at_speed_1 = costs;
    for (auto& c : at_speed_1) {
      c.fwd_s *= 6;
      c.bwd_s *= 6;
    }
    model::placement pl;
    for (std::size_t k = 1; k < p.stages.size(); ++k) pl.cuts.push_back(static_cast<int>(p.stages[k].first_layer));
    for (const auto& st : p.stages) pl.devices.push_back(st.device);
    CHECK(p.estimate.step_s ==
          Approx(model::evaluate(at_speed_1, p.devices, model::same_process_link(), pl).step_s));
    const auto j = nlohmann::json::parse(describe_placement(p, s, true));  // valid JSON, names escaped
    CHECK(j["predicted_step_s"].get<double>() == Approx(p.estimate.step_s));
    CHECK(j["stages"].size() == p.estimate.stages.size());
    CHECK(j["devices"].size() == p.devices.size());
    CHECK(j["devices"][0]["name"].get<std::string>() == p.devices[0].name);
    CHECK_THAT(describe_placement(p, s, false), Contains("(bottleneck)"));
  }
  // With a thread per stage, the fastest device is this machine's speed: no sharing.
  const plan roomy = make_plan(pipeline(3, placement_kind::greedy, {1, 2, 4, 1}), topology::local(4), four_tensors(),
                               100, &profile, &costs);
  for (const auto& st : roomy.stages) CHECK(st.slowdown == Approx(4.0 / roomy.devices[st.device].speed));
  // The optimum is never worse than greedy, nor greedy than this random draw's placement by more than rounding.
  const plan opt = make_plan(pipeline(3, placement_kind::optimal, {1, 2, 4, 1}), topology::local(2), four_tensors(), 100,
                             &profile, &costs);
  const plan gr = make_plan(pipeline(3, placement_kind::greedy, {1, 2, 4, 1}), topology::local(2), four_tensors(), 100,
                            &profile, &costs);
  CHECK(opt.estimate.step_s <= gr.estimate.step_s + 1e-12);
  // The costliest layer (1) goes to the fastest device (3) in the optimum.
  for (const auto& st : opt.stages)
    if (st.first_layer <= 1 && 1 < st.last_layer) CHECK(st.device == 2);
}

TEST_CASE("plan: --link-cost prices the activations a cut sends", "[train][plan]") {
  const auto profile = four_layers();
  const auto costs = measured();
  settings s = pipeline(2, placement_kind::manual, {});
  s.pipeline.cuts = {2};
  const plan fast = make_plan(s, topology::local(2), four_tensors(), 100, &profile, &costs);
  s.pipeline.link_cost = {1e-3f, 0.5f};  // 1 ms per byte, 0.5 s per message
  const plan slow = make_plan(s, topology::local(2), four_tensors(), 100, &profile, &costs);
  // Stage 0 sends layer 1's 200 bytes and gets as many back: 2 x (0.2 + 0.5) s.
  CHECK(slow.estimate.stages[0].transfer_s == Approx(1.4).epsilon(1e-5));
  CHECK(slow.estimate.stages[1].transfer_s == 0);
  CHECK(fast.estimate.stages[0].transfer_s < 1e-3);
  CHECK(slow.estimate.bottleneck == 0);
}

TEST_CASE("plan: a cluster's declared devices place the stages on their nodes", "[train][plan]") {
  const auto profile = four_layers();
  topology t;
  t.nodes.push_back({"a", 2, true, true, {{"cpu0", 1.0, 0}}});
  t.nodes.push_back({"b", 2, true, true, {{"cpu0", 3.0, 0}, {"cpu1", 1.0, 0}}});
  t.nodes.push_back({"c", 2, false, true, {{"cpu0", 8.0, 0}}});  // may not host stages: its device is not used
  const plan p = make_plan(pipeline(2, placement_kind::optimal, {}), t, four_tensors(), 100, &profile);
  REQUIRE(p.devices.size() == 3);
  for (const auto& st : p.stages) CHECK(st.fwd_action_s == 0);  // declared devices are real: nothing emulated
  CHECK(p.devices[0].name == "cpu0@a");
  CHECK(p.devices[1].name == "cpu0@b");
  CHECK(p.device_nodes == std::vector<uint32_t>{0, 1, 1});
  REQUIRE(p.stages.size() == 2);
  bool fast = false;
  for (const auto& st : p.stages) {
    CHECK(st.address.node == p.device_nodes[st.device]);
    CHECK(st.slowdown == 1.0f);  // real devices: nothing emulated
    fast = fast || st.device == 1;
  }
  CHECK(fast);  // the optimum uses the fastest device
}

TEST_CASE("plan: even placement keeps balanced cuts and takes --stage-devices", "[train][plan]") {
  const auto profile = four_layers();
  settings s = pipeline(2, placement_kind::even, {1, 4});
  s.pipeline.stage_devices = {1, 0};
  const plan p = make_plan(s, topology::local(2), four_tensors(), 100, &profile);
  REQUIRE(p.stages.size() == 2);
  CHECK(p.stages[0].last_layer == 2);  // multiply-adds 10 + 40 | 20 + 30
  CHECK(p.stages[0].device == 1);
  CHECK(p.stages[0].slowdown == Approx(1.0));
  CHECK(p.stages[1].device == 0);
  CHECK(p.stages[1].slowdown == Approx(4.0));
  // Without device speeds every stage runs at full speed.
  const plan q = make_plan(pipeline(2, placement_kind::even, {}), topology::local(2), four_tensors(), 100, &profile);
  for (const auto& st : q.stages) CHECK(st.slowdown == Approx(1.0));
}

TEST_CASE("plan: a placement that does not fit the devices' memory names the device", "[train][plan]") {
  const auto profile = four_layers();
  const auto costs = measured();
  settings s = pipeline(2, placement_kind::greedy, {1, 1});
  s.pipeline.device_memory_mb = {0.0001f, 0.0001f};  // about 100 bytes each: no layer's activations fit
  CHECK_THROWS_WITH(make_plan(s, topology::local(2), four_tensors(), 100, &profile, &costs), Contains("device"));
  s.pipeline.placement = placement_kind::manual;
  s.pipeline.cuts = {2};
  CHECK_THROWS_WITH(make_plan(s, topology::local(2), four_tensors(), 100, &profile, &costs), Contains("device"));
}

TEST_CASE("job: placement options are checked", "[train][job]") {
  auto invalid = [](const settings& s) {
    try {
      validate(s);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("valid");
  };
  CHECK_THAT(invalid(pipeline(3, placement_kind::greedy, {1, 2})), Contains("--device-speeds: 2 devices for 3 stages"));
  CHECK_THAT(invalid(pipeline(2, placement_kind::greedy, {1, 0})), Contains("--device-speeds: expected a list of numbers > 0, got [1.0, 0.0]"));
  settings m = pipeline(2, placement_kind::manual, {});
  CHECK_THAT(invalid(m), Contains("--placement manual needs --pipeline-cuts"));
  m.pipeline.cuts = {2};
  m.pipeline.stage_devices = {1, 1};
  CHECK_THAT(invalid(m), Contains("device 1 given to two stages"));
  m.pipeline.stage_devices = {0, 2};
  CHECK_THAT(invalid(m), Contains("device 2 of 2 devices"));
  settings link = pipeline(2, placement_kind::greedy, {1, 1});
  link.pipeline.link_cost = {1e-9f};
  CHECK_THAT(invalid(link), Contains("--link-cost: give seconds per byte and seconds per message"));
  settings one = pipeline(1, placement_kind::greedy, {});
  CHECK_THAT(invalid(one), Contains("give --pipeline-stages K > 1"));
  settings mem = pipeline(2, placement_kind::greedy, {1, 1});
  mem.pipeline.device_memory_mb = {1};
  CHECK_THAT(invalid(mem), Contains("--device-memory: 1 limits for 2 devices"));
}
