// Placement of a chain on heterogeneous devices: the cost model against
// hand-computed values, the optimal placer against brute force, the greedy and
// random placers against the optimum and the memory limits.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include "model/placement.hpp"
#include "tensor/error.hpp"
#include "tests/test_util.hpp"

using namespace troupe::model;
using Catch::Contains;
using troupe::testing::message;

namespace {

/// 3 layers, 2 devices, a link of 0.01 s/byte + 0.5 s per message.
struct small_example {
  std::vector<layer_cost> costs{{1, 2, 10, 100}, {2, 4, 20, 50}, {1, 1, 0, 10}};
  std::vector<device_cost> devices{{"slow", 1, 0}, {"fast", 2, 1000}};
  link_cost link{0.01, 0.5};
};

struct instance {
  std::vector<layer_cost> costs;
  std::vector<device_cost> devices;
  link_cost link;
  int stages = 0;
};

instance random_instance(std::mt19937_64& rng, int max_layers, int max_devices, bool tight_memory) {
  std::uniform_real_distribution<double> u(0, 1);
  instance in;
  const int n = std::uniform_int_distribution<int>(1, max_layers)(rng);
  const int d = std::uniform_int_distribution<int>(1, max_devices)(rng);
  for (int i = 0; i < n; ++i)
    in.costs.push_back({0.01 * std::pow(10, 2 * u(rng)), 0.02 * std::pow(10, 2 * u(rng)),
                        static_cast<int64_t>(1000 * u(rng)), static_cast<int64_t>(4000 * u(rng))});
  int64_t total = 0;
  for (const auto& l : in.costs) total += 3 * l.param_bytes + l.act_bytes;
  for (int j = 0; j < d; ++j) {
    const int64_t mem = tight_memory ? static_cast<int64_t>(total * (0.2 + 0.8 * u(rng))) : 0;
    in.devices.push_back({"dev" + std::to_string(j), 1 + 7 * u(rng), mem});
  }
  in.link = {1e-6 * u(rng), 0.01 * u(rng)};
  in.stages = std::uniform_int_distribution<int>(1, std::min(n, d))(rng);
  return in;
}

/// The least step time over every cut set and every ordered choice of devices; inf if none fits.
double brute_force(const instance& in, placement* best_p = nullptr) {
  const int n = static_cast<int>(in.costs.size()), d = static_cast<int>(in.devices.size()), k = in.stages;
  placement_options o;
  double best = INFINITY;
  std::vector<int> pick(n - 1, 0);  // which of layers 1..n-1 start a stage
  std::fill(pick.end() - (k - 1), pick.end(), 1);
  do {
    placement p;
    for (int i = 0; i < n - 1; ++i)
      if (pick[i]) p.cuts.push_back(i + 1);
    std::vector<int> devs(d);
    std::iota(devs.begin(), devs.end(), 0);
    do {
      p.devices.assign(devs.begin(), devs.begin() + k);
      const auto e = evaluate(in.costs, in.devices, in.link, p, o);
      if (e.fits && e.step_s < best) {
        best = e.step_s;
        if (best_p) *best_p = p;
      }
      std::reverse(devs.begin() + k, devs.end());  // the next permutation of the first k
    } while (std::next_permutation(devs.begin(), devs.end()));
  } while (std::next_permutation(pick.begin(), pick.end()));
  return best;
}

placement_options stages(int k) {
  placement_options o;
  o.stages = k;
  return o;
}

/// `f` throws a troupe::error whose message holds every one of `parts`.
template <typename F>
void check_error(F f, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const troupe::error& e) {
    for (const auto& part : parts) CHECK_THAT(std::string(e.what()), Contains(part));
    return;
  }
  FAIL("no troupe::error; expected one saying " << parts.front());
}

void check_valid(const instance& in, const placement& p) {
  INFO(to_string(p));
  REQUIRE(static_cast<int>(p.devices.size()) == in.stages);
  const auto e = evaluate(in.costs, in.devices, in.link, p);  // throws for a malformed placement
  CHECK(e.fits);
}

} // namespace

TEST_CASE("placement: evaluate gives the hand-computed stage times, bottleneck and step time", "[placement]") {
  small_example x;
  // Layer 0 on the fast device, layers 1-2 on the slow one.
  auto e = evaluate(x.costs, x.devices, x.link, placement{{1}, {1, 0}});
  REQUIRE(e.stages.size() == 2);
  CHECK(e.stages[0].first == 0);
  CHECK(e.stages[0].last == 1);
  CHECK(e.stages[0].device == 1);
  CHECK(e.stages[0].fwd_s == Approx(0.5));
  CHECK(e.stages[0].bwd_s == Approx(1.0));
  CHECK(e.stages[0].send_bytes == 100);
  CHECK(e.stages[0].transfer_s == Approx(2 * (0.01 * 100 + 0.5)));  // activation out, gradient back
  CHECK(e.stages[0].time_s == Approx(4.5));
  CHECK(e.stages[0].memory_bytes == 3 * 10 + 100);
  CHECK(e.stages[1].fwd_s == Approx(3));
  CHECK(e.stages[1].bwd_s == Approx(5));
  CHECK(e.stages[1].transfer_s == 0);
  CHECK(e.stages[1].send_bytes == 0);
  CHECK(e.stages[1].time_s == Approx(8));
  CHECK(e.stages[1].memory_bytes == 3 * 20 + 60);
  CHECK(e.bottleneck == 1);
  CHECK(e.step_s == Approx(8));
  CHECK(e.fits);
  // Layers 0-1 on the slow device: the first stage is the bottleneck.
  e = evaluate(x.costs, x.devices, x.link, placement{{2}, {0, 1}});
  CHECK(e.stages[0].time_s == Approx(9 + 2 * (0.01 * 50 + 0.5)));
  CHECK(e.stages[1].time_s == Approx(1));
  CHECK(e.bottleneck == 0);
  CHECK(e.step_s == Approx(11));
  // The memory factor (4: Adam) and a limit that is exceeded.
  placement_options adam;
  adam.memory_factor = 4;
  x.devices[1].memory_bytes = 100;
  e = evaluate(x.costs, x.devices, x.link, placement{{1}, {1, 0}}, adam);
  CHECK(e.stages[0].memory_bytes == 4 * 10 + 100);
  CHECK(stage_memory(x.costs, 0, 1, 4) == 140);
  CHECK_FALSE(e.stages[0].fits);
  CHECK(e.stages[1].fits);
  CHECK_FALSE(e.fits);
}

TEST_CASE("placement: optimal finds the hand-computed optimum of the small example", "[placement]") {
  small_example x;
  // cut 1 [slow, fast]: max(3 + 3, 4) = 6; cut 1 [fast, slow]: 8; cut 2 [slow, fast]: 11; cut 2 [fast, slow]: 6.5.
  const placement p = place_optimal(x.costs, x.devices, x.link);
  CHECK(p.cuts == std::vector<int>{1});
  CHECK(p.devices == std::vector<int>{0, 1});
  CHECK(evaluate(x.costs, x.devices, x.link, p).step_s == Approx(6));
  // One stage: every layer on the fast device.
  const placement one = place_optimal(x.costs, x.devices, x.link, stages(1));
  CHECK(one.cuts.empty());
  CHECK(one.devices == std::vector<int>{1});
}

TEST_CASE("placement: optimal equals brute force on random small instances", "[placement]") {
  std::mt19937_64 rng(12);
  int fitting = 0, none = 0;
  for (int t = 0; t < 60; ++t) {
    const instance in = random_instance(rng, 8, 4, t % 2 == 1);
    INFO("instance " << t << ": " << in.costs.size() << " layers, " << in.devices.size() << " devices, "
                     << in.stages << " stages");
    const double best = brute_force(in);
    if (std::isinf(best)) {
      CHECK_THROWS_MATCHES(place_optimal(in.costs, in.devices, in.link, stages(in.stages)), troupe::error,
                           message(Contains("no valid placement")));
      ++none;
      continue;
    }
    const placement p = place_optimal(in.costs, in.devices, in.link, stages(in.stages));
    check_valid(in, p);
    CHECK(evaluate(in.costs, in.devices, in.link, p).step_s == Approx(best).epsilon(1e-12));
    ++fitting;
  }
  CHECK(fitting >= 40);  // the memory limits bind in some instances, not most
  CHECK(none >= 1);
}

TEST_CASE("placement: greedy is never better than optimal and always fits where optimal does", "[placement]") {
  std::mt19937_64 rng(5);
  for (int t = 0; t < 200; ++t) {
    instance in = random_instance(rng, 24, 6, t % 2 == 1);
    INFO("instance " << t);
    placement opt;
    try {
      opt = place_optimal(in.costs, in.devices, in.link, stages(in.stages));
    } catch (const troupe::error&) {
      CHECK_THROWS_MATCHES(place_greedy(in.costs, in.devices, in.link, stages(in.stages)), troupe::error,
                           message(Contains("no valid placement")));
      continue;
    }
    const double best = evaluate(in.costs, in.devices, in.link, opt).step_s;
    for (bool search : {false, true}) {
      placement_options o = stages(in.stages);
      o.refine = o.reorder = search;
      const placement g = place_greedy(in.costs, in.devices, in.link, o);
      check_valid(in, g);
      CHECK(evaluate(in.costs, in.devices, in.link, g).step_s >= best * (1 - 1e-12));
    }
  }
}

TEST_CASE("placement: greedy is exact on equal layers and devices, within its bound on equal devices",
          "[placement]") {
  // 12 equal layers, 4 equal devices: 3 layers each.
  instance eq;
  eq.costs.assign(12, layer_cost{1, 2, 100, 100});
  for (int j = 0; j < 4; ++j) eq.devices.push_back({"d" + std::to_string(j), 2, 0});
  eq.link = {1e-3, 0.01};
  eq.stages = 4;
  for (bool search : {false, true}) {
    placement_options o;
    o.refine = o.reorder = search;
    const placement g = place_greedy(eq.costs, eq.devices, eq.link, o);
    CHECK(g.cuts == std::vector<int>{3, 6, 9});
    CHECK(evaluate(eq.costs, eq.devices, eq.link, g).step_s == Approx(4.5 + 2 * 0.11));
  }
  // Speeds 1, 2 and 3 on 12 equal layers: 2, 4 and 6 layers, one stage time each.
  instance het = eq;
  het.devices = {{"a", 1, 0}, {"b", 2, 0}, {"c", 3, 0}};
  het.link = {};
  het.stages = 3;
  const placement g = place_greedy(het.costs, het.devices, het.link);
  CHECK(evaluate(het.costs, het.devices, het.link, g).step_s == Approx(6));
  CHECK(evaluate(het.costs, het.devices, het.link, place_optimal(het.costs, het.devices, het.link)).step_s ==
        Approx(6));
  // Equal devices, no link cost, no memory limit, uneven layers: the walk's stages exceed the
  // remaining average by at most a layer, and the average grows by at most a layer / (stages left),
  // so greedy <= W / K + L * (1 + H(K-1)) <= optimal + L * (1 + H(K-1)).
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(0, 1);
  for (int t = 0; t < 30; ++t) {
    instance in;
    const int n = 8 + static_cast<int>(56 * u(rng)), k = 2 + static_cast<int>(6 * u(rng));
    double total = 0, largest = 0;
    for (int i = 0; i < n; ++i) {
      const double c = std::pow(10, 2 * u(rng));
      in.costs.push_back({c / 3, 2 * c / 3, 0, 1000});
      total += c;
      largest = std::max(largest, c);
    }
    for (int j = 0; j < k; ++j) in.devices.push_back({"d" + std::to_string(j), 1, 0});
    in.stages = k;
    double harmonic = 0;
    for (int i = 1; i < k; ++i) harmonic += 1.0 / i;
    placement_options plain;
    plain.refine = plain.reorder = false;
    const placement g = place_greedy(in.costs, in.devices, in.link, plain);
    const double greedy = evaluate(in.costs, in.devices, in.link, g).step_s;
    const double best = evaluate(in.costs, in.devices, in.link, place_optimal(in.costs, in.devices, in.link)).step_s;
    INFO("instance " << t << ": greedy " << greedy << ", optimal " << best);
    CHECK(greedy <= total / k + largest * (1 + harmonic) + 1e-9);
    CHECK(greedy <= best + largest * (1 + harmonic) + 1e-9);
  }
}

TEST_CASE("placement: greedy uses a device outside the fastest ones where only it fits a layer", "[placement]") {
  // Layer 0 fits only the slowest device; the two fastest cannot hold it in any order.
  const std::vector<layer_cost> costs{{1, 1, 0, 500}, {1, 1, 0, 1}, {1, 1, 0, 1}, {1, 1, 0, 1}};
  const std::vector<device_cost> devices{{"fast", 8, 10}, {"medium", 4, 10}, {"big", 1, 1000}};
  for (bool search : {false, true}) {
    placement_options o = stages(2);
    o.refine = o.reorder = search;
    const placement g = place_greedy(costs, devices, {}, o);
    INFO(to_string(g));
    CHECK(g.devices[0] == 2);
    CHECK(evaluate(costs, devices, {}, g).fits);
  }
  const placement opt = place_optimal(costs, devices, {}, stages(2));
  CHECK(opt.cuts == std::vector<int>{1});
  CHECK(opt.devices == std::vector<int>{2, 0});
}

TEST_CASE("placement: optimal may leave slow devices out when there are fewer stages", "[placement]") {
  const std::vector<layer_cost> costs(6, layer_cost{1, 1, 0, 0});
  const std::vector<device_cost> devices{{"s1", 1, 0}, {"s4", 4, 0}, {"s2", 2, 0}};
  const placement p = place_optimal(costs, devices, {}, stages(2));
  CHECK(std::set<int>(p.devices.begin(), p.devices.end()) == std::set<int>{1, 2});
  CHECK(evaluate(costs, devices, {}, p).step_s == Approx(2));  // 4 layers at speed 4, 2 at speed 2
  const placement g = place_greedy(costs, devices, {}, stages(2));
  CHECK(evaluate(costs, devices, {}, g).step_s == Approx(2));
}

TEST_CASE("placement: random placements are valid, fit the memory and repeat with their seed", "[placement]") {
  std::mt19937_64 rng(9);
  for (int t = 0; t < 40; ++t) {
    const instance in = random_instance(rng, 30, 6, true);
    INFO("instance " << t);
    placement_options o = stages(in.stages);
    o.seed = 100 + t;
    placement p;
    try {
      p = place_random(in.costs, in.devices, in.link, o);
    } catch (const troupe::error&) {
      continue;  // no draw fits (checked below on a chosen instance)
    }
    check_valid(in, p);
    const placement again = place_random(in.costs, in.devices, in.link, o);
    CHECK(again.cuts == p.cuts);
    CHECK(again.devices == p.devices);
  }
  // Seeds draw different placements; every draw of a tight instance fits.
  small_example x;
  x.devices[1].memory_bytes = 200;  // "fast" holds layer 0 alone (130) or layers 1-2 (120), not layers 0-1
  std::set<std::pair<std::vector<int>, std::vector<int>>> seen;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    placement_options o;
    o.seed = seed;
    const placement p = place_random(x.costs, x.devices, x.link, o);
    CHECK(evaluate(x.costs, x.devices, x.link, p).fits);
    CHECK_FALSE((p.cuts == std::vector<int>{2} && p.devices == std::vector<int>{1, 0}));
    seen.insert({p.cuts, p.devices});
  }
  CHECK(seen.size() == 3);  // the three placements that fit
}

TEST_CASE("placement: a device too small for a layer is an error naming it, from every placer", "[placement]") {
  const std::vector<layer_cost> costs{{1, 1, 0, 10}, {1, 1, 20, 80}, {1, 1, 0, 10}};  // layer 1: 3 * 20 + 80 = 140
  const std::vector<device_cost> devices{{"gpu0", 1, 50}, {"gpu1", 2, 100}};
  const std::vector<std::string> names_it{"device gpu1 (limit 100 B", "140 B for layer 1 alone", "short of 40 B"};
  check_error([&] { place_greedy(costs, devices, {}); }, names_it);
  check_error([&] { place_optimal(costs, devices, {}); }, names_it);
  check_error([&] { place_random(costs, devices, {}); }, names_it);
  // Every layer fits somewhere, but not the whole chain: the shortfall over the devices.
  const std::vector<layer_cost> many(6, layer_cost{1, 1, 0, 40});
  const std::vector<std::string> short_in_all{"need at least 240 B in all", "(gpu1, gpu0) hold 150 B, short of 90 B"};
  check_error([&] { place_greedy(many, devices, {}); }, short_in_all);
  check_error([&] { place_optimal(many, devices, {}); }, short_in_all);
}

TEST_CASE("placement: a manual placement that exceeds a device's memory names the device and the shortfall",
          "[placement]") {
  small_example x;
  x.devices[1].memory_bytes = 100;
  // Layer 0 on "fast": 3 * 10 + 100 = 130 bytes.
  CHECK_THROWS_MATCHES(place_manual(x.costs, x.devices, placement{{1}, {1, 0}}), troupe::error,
                       message(Contains("stage 0 (layers 0..0) needs 130 B on device fast (limit 100 B)") &&
                               Contains("short of 30 B")));
  const placement ok = place_manual(x.costs, x.devices, placement{{2}, {0, 1}});
  CHECK(ok.cuts == std::vector<int>{2});
  CHECK(ok.devices == std::vector<int>{0, 1});
}

TEST_CASE("placement: malformed placements and inputs are errors", "[placement]") {
  const std::vector<layer_cost> costs(5, layer_cost{1, 1, 1, 1});
  const std::vector<device_cost> devices{{"a", 1, 0}, {"b", 1, 0}, {"c", 1, 0}};
  const auto manual = [&](placement p) { return place_manual(costs, devices, p); };
  CHECK_THROWS_MATCHES(manual({{3, 2}, {0, 1, 2}}), troupe::error, message(Contains("increase strictly")));
  CHECK_THROWS_MATCHES(manual({{2, 2}, {0, 1, 2}}), troupe::error, message(Contains("increase strictly")));
  CHECK_THROWS_MATCHES(manual({{0, 2}, {0, 1, 2}}), troupe::error, message(Contains("cut 0 outside [1, 4]")));
  CHECK_THROWS_MATCHES(manual({{2, 5}, {0, 1, 2}}), troupe::error, message(Contains("cut 5 outside [1, 4]")));
  CHECK_THROWS_MATCHES(manual({{2}, {0, 1, 2}}), troupe::error, message(Contains("3 stages need 2 cuts, got 1")));
  CHECK_THROWS_MATCHES(manual({{}, {}}), troupe::error, message(Contains("no stages")));
  CHECK_THROWS_MATCHES(manual({{2}, {1, 1}}), troupe::error, message(Contains("device b holds two stages")));
  CHECK_THROWS_MATCHES(manual({{2}, {0, 3}}), troupe::error, message(Contains("device index 3 outside [0, 3)")));
  CHECK_NOTHROW(manual({{1, 4}, {2, 0, 1}}));
  CHECK_THROWS_MATCHES(place_greedy(costs, devices, {}, stages(4)), troupe::error,
                       message(Contains("4 stages need as many devices")));
  CHECK_THROWS_MATCHES(place_optimal(std::vector<layer_cost>(2), devices, {}, stages(3)), troupe::error,
                       message(Contains("3 stages need as many layers")));
  CHECK_THROWS_MATCHES(place_optimal({}, devices, {}), troupe::error, message(Contains("no layers")));
  CHECK_THROWS_MATCHES(place_greedy(costs, {{"z", 0, 0}}, {}), troupe::error,
                       message(Contains("device z: speed must be > 0")));
  CHECK_THROWS_MATCHES(parse_placer("best"), troupe::error, message(Contains("random, greedy, optimal or manual")));
  CHECK(parse_placer("optimal") == placer_kind::optimal);
  CHECK(std::string(to_string(placer_kind::greedy)) == "greedy");
}

TEST_CASE("placement: fit_link recovers a and b from exact points", "[placement]") {
  const double a = 1e-9, b = 50e-6;
  std::vector<std::pair<int64_t, double>> pts;
  for (int64_t bytes : {0L, 1000L, 65536L, 1000000L, 100000000L}) pts.emplace_back(bytes, a * bytes + b);
  const link_cost l = fit_link(pts);
  CHECK(l.a == Approx(a).epsilon(1e-9));
  CHECK(l.b == Approx(b).epsilon(1e-6));
  CHECK(l.time(2000000) == Approx(a * 2e6 + b));
  // A negative intercept (noise) is clamped to 0 and the slope refitted through the origin.
  const link_cost o = fit_link({{1000, 0.5e-6}, {2000, 1.6e-6}, {3000, 2.6e-6}});
  CHECK(o.b == 0);
  CHECK(o.a == Approx((1000 * 0.5e-6 + 2000 * 1.6e-6 + 3000 * 2.6e-6) / (1e6 + 4e6 + 9e6)));
  CHECK_THROWS_MATCHES(fit_link({{1000, 1e-6}, {1000, 2e-6}}), troupe::error, message(Contains("same size")));
  CHECK_THROWS_MATCHES(fit_link({{1000, 1e-6}}), troupe::error, message(Contains("two different sizes")));
}
