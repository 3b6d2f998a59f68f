// placement_study: the placers of model/placement.hpp on generated instances
// (issue 12): random chains of 8-64 layers with costs log-uniform over two
// decades, 2-8 devices of speeds 1-8 with memory limits that bind in some
// instances, a veth-like link (1 GB/s, 50 us per message), as many stages as
// devices. Per instance the optimum, greedy in three variants (greedy_walk:
// the walk alone; greedy_refined: with refine; greedy: with refine and
// reorder, the default) and the median of 100 random placements, as one JSON
// line; then a summary, and the time greedy takes for a 1,000-layer chain and
// optimal for 200 layers, on 8 devices.
//
//   troupe_placement_study [--instances N] [--seed S] [--json FILE]
//   troupe_placement_study --fit-link FILE   (lines "bytes seconds": prints the
//                                            fitted link cost, bench/fit_link.sh)
//
// bench/placement_study.py draws the ratios from FILE.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "model/placement.hpp"
#include "tensor/error.hpp"

namespace {

using namespace troupe::model;
using clock_type = std::chrono::steady_clock;

struct instance {
  std::vector<layer_cost> costs;
  std::vector<device_cost> devices;
};

const link_cost veth{1.0 / 1e9, 50e-6};

double log_uniform(std::mt19937_64& rng, double lo, double hi) {
  return lo * std::pow(hi / lo, std::uniform_real_distribution<double>(0, 1)(rng));
}

std::vector<layer_cost> random_chain(std::mt19937_64& rng, int n) {
  std::vector<layer_cost> costs;
  for (int i = 0; i < n; ++i) {
    const double fwd = log_uniform(rng, 1e-3, 100e-3);  // per mini-batch
    const double bwd = fwd * std::uniform_real_distribution<double>(1.5, 2.5)(rng);
    const auto params = static_cast<int64_t>(log_uniform(rng, 1e4, 1e7));
    costs.push_back({fwd, bwd, params, static_cast<int64_t>(log_uniform(rng, 1e5, 1e7))});
  }
  return costs;
}

/// Memory limits around an even share of the chain's memory: most instances fit, some tightly.
instance random_instance(std::mt19937_64& rng) {
  instance in;
  const int n = std::uniform_int_distribution<int>(8, 64)(rng);
  const int d = std::uniform_int_distribution<int>(2, 8)(rng);
  in.costs = random_chain(rng, n);
  const double total = static_cast<double>(stage_memory(in.costs, 0, n));
  for (int j = 0; j < d; ++j)
    in.devices.push_back({"dev" + std::to_string(j), std::uniform_real_distribution<double>(1, 8)(rng),
                          static_cast<int64_t>(total / d * std::uniform_real_distribution<double>(1.1, 3.0)(rng))});
  return in;
}

double step(const instance& in, const placement& p) { return evaluate(in.costs, in.devices, veth, p).step_s; }

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

placement_options greedy_variant(int level) {
  placement_options o;
  o.refine = level >= 1;
  o.reorder = level >= 2;
  return o;
}

const char* variant_name[] = {"greedy_walk", "greedy_refined", "greedy"};

template <typename F>
double median_ms(int reps, F f) {
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = clock_type::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t0).count());
  }
  return median(ms);
}

struct summary {
  std::vector<double> greedy[3], random;
  std::vector<double> random_over_greedy[3];
  int binding = 0, infeasible = 0, random_failed = 0;
};

std::string instance_line(int i, const instance& in, summary& sum) {
  const double opt = step(in, place_optimal(in.costs, in.devices, veth));
  instance loose = in;
  for (auto& d : loose.devices) d.memory_bytes = 0;
  const bool binds = opt > step(loose, place_optimal(loose.costs, loose.devices, veth)) * (1 + 1e-12);
  sum.binding += binds;
  double g[3];
  for (int v = 0; v < 3; ++v) g[v] = step(in, place_greedy(in.costs, in.devices, veth, greedy_variant(v)));
  std::vector<double> draws;
  for (uint64_t seed = 0; seed < 100; ++seed) {
    placement_options o;
    o.seed = seed;
    try {
      draws.push_back(step(in, place_random(in.costs, in.devices, veth, o)));
    } catch (const troupe::error&) {
      ++sum.random_failed;
    }
  }
  const double rnd = median(draws);
  for (int v = 0; v < 3; ++v) {
    sum.greedy[v].push_back(g[v] / opt);
    sum.random_over_greedy[v].push_back(rnd / g[v]);
  }
  sum.random.push_back(rnd / opt);
  std::ostringstream out;
  out.precision(6);
  out << "{\"instance\":" << i << ",\"layers\":" << in.costs.size() << ",\"devices\":" << in.devices.size()
      << ",\"speeds\":[";
  for (size_t j = 0; j < in.devices.size(); ++j) out << (j ? "," : "") << in.devices[j].speed;
  out << "],\"memory_binds\":" << (binds ? "true" : "false") << ",\"optimal_s\":" << opt;
  for (int v = 0; v < 3; ++v) out << ",\"" << variant_name[v] << "_s\":" << g[v];
  out << ",\"random_median_s\":" << rnd << ",\"random_draws\":" << draws.size();
  for (int v = 0; v < 3; ++v) out << ",\"" << variant_name[v] << "_ratio\":" << g[v] / opt;
  out << ",\"random_ratio\":" << rnd / opt << "}";
  return out.str();
}

/// A chain of n layers on 8 devices of speeds 1..8, each holding a quarter of the chain's memory.
instance timing_instance(std::mt19937_64& rng, int n) {
  instance in;
  in.costs = random_chain(rng, n);
  const int64_t quarter = stage_memory(in.costs, 0, n) / 4;
  for (int j = 0; j < 8; ++j) in.devices.push_back({"dev" + std::to_string(j), 1.0 + j, quarter});
  return in;
}

instance unlimited(instance in) {
  for (auto& d : in.devices) d.memory_bytes = 0;
  return in;
}

struct timings {
  double greedy = 0, greedy_unlimited = 0, walk = 0, optimal = 0, optimal_unlimited = 0;
};

/// Median ms of greedy on 1,000 layers and optimal on 200, 8 devices, with and without memory limits.
timings time_placers(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const instance big = timing_instance(rng, 1000), mid = timing_instance(rng, 200);
  const instance big_u = unlimited(big), mid_u = unlimited(mid);
  timings t;
  t.greedy = median_ms(7, [&] { place_greedy(big.costs, big.devices, veth); });
  t.greedy_unlimited = median_ms(7, [&] { place_greedy(big_u.costs, big_u.devices, veth); });
  t.walk = median_ms(7, [&] { place_greedy(big.costs, big.devices, veth, greedy_variant(0)); });
  t.optimal = median_ms(3, [&] { place_optimal(mid.costs, mid.devices, veth); });
  t.optimal_unlimited = median_ms(3, [&] { place_optimal(mid_u.costs, mid_u.devices, veth); });
  return t;
}

std::string summary_line(const summary& s, int instances, const timings& t) {
  std::ostringstream out;
  out.precision(4);
  out << "{\"summary\":true,\"instances\":" << instances << ",\"memory_binds\":" << s.binding
      << ",\"regenerated_infeasible\":" << s.infeasible << ",\"random_draws_failed\":" << s.random_failed;
  for (int v = 0; v < 3; ++v) {
    int twice = 0;
    for (double r : s.random_over_greedy[v]) twice += r >= 2;
    out << ",\"" << variant_name[v] << "_ratio_median\":" << median(s.greedy[v]) << ",\"" << variant_name[v]
        << "_ratio_worst\":" << *std::max_element(s.greedy[v].begin(), s.greedy[v].end()) << ",\"" << variant_name[v]
        << "_2x_better_than_random\":" << static_cast<double>(twice) / s.greedy[v].size() << ",\"" << variant_name[v]
        << "_random_over_greedy_median\":" << median(s.random_over_greedy[v]);
  }
  out << ",\"random_ratio_median\":" << median(s.random) << ",\"greedy_1000x8_ms\":" << t.greedy
      << ",\"greedy_1000x8_unlimited_ms\":" << t.greedy_unlimited << ",\"greedy_walk_1000x8_ms\":" << t.walk
      << ",\"optimal_200x8_ms\":" << t.optimal << ",\"optimal_200x8_unlimited_ms\":" << t.optimal_unlimited << "}";
  return out.str();
}

} // namespace

/// model::fit_link on the (bytes, seconds) lines of `path`: "a b" on stdout.
int fit_link_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::cerr << "placement_study: cannot read " << path << "\n";
    return 2;
  }
  std::vector<std::pair<int64_t, double>> points;
  double bytes = 0, seconds = 0;
  while (in >> bytes >> seconds) points.emplace_back(static_cast<int64_t>(bytes), seconds);
  try {
    const troupe::model::link_cost l = troupe::model::fit_link(points);
    std::printf("%.6g %.6g\n", l.a, l.b);
  } catch (const std::exception& e) {
    std::cerr << "placement_study: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--fit-link") return fit_link_file(argv[2]);
  int instances = 100;
  uint64_t seed = 1;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 < argc && a == "--instances") instances = std::atoi(argv[++i]);
    else if (i + 1 < argc && a == "--seed") seed = std::strtoull(argv[++i], nullptr, 10);
    else if (i + 1 < argc && a == "--json") json = argv[++i];
    else {
      std::cerr << "usage: troupe_placement_study [--instances N] [--seed S] [--json FILE] | --fit-link FILE\n";
      return 2;
    }
  }
  if (instances < 1) {
    std::cerr << "placement_study: --instances must be >= 1\n";
    return 2;
  }
  std::ofstream file;
  if (!json.empty()) {
    file.open(json);
    if (!file) {
      std::cerr << "placement_study: cannot write " << json << "\n";
      return 1;
    }
  }
  std::mt19937_64 rng(seed);
  summary sum;
  for (int i = 0; i < instances; ++i) {
    for (;;) {
      const instance in = random_instance(rng);
      try {
        const std::string line = instance_line(i, in, sum);
        std::cout << line << "\n";
        if (file) file << line << "\n";
        break;
      } catch (const troupe::error&) {
        ++sum.infeasible;  // no placement fits: draw another instance
      }
    }
  }
  const timings t = time_placers(seed + 1);
  const std::string line = summary_line(sum, instances, t);
  std::cout << line << "\n";
  if (file) file << line << "\n";
  std::printf("\n%d instances (%d with binding memory, %d infeasible ones redrawn)\n", instances, sum.binding,
              sum.infeasible);
  for (int v = 0; v < 3; ++v) {
    int twice = 0;
    for (double r : sum.random_over_greedy[v]) twice += r >= 2;
    std::printf("%-14s / optimal: median %.4f, worst %.4f; >= 2x better than the median random in %.0f%%\n",
                variant_name[v], median(sum.greedy[v]), *std::max_element(sum.greedy[v].begin(), sum.greedy[v].end()),
                100.0 * twice / instances);
  }
  std::printf("random median / optimal: median %.3f; median random / greedy: median %.3f\n", median(sum.random),
              median(sum.random_over_greedy[2]));
  std::printf("greedy, 1000 layers x 8 devices: %.2f ms (%.2f ms without memory limits; the walk alone %.3f ms)\n",
              t.greedy, t.greedy_unlimited, t.walk);
  std::printf("optimal, 200 layers x 8 devices: %.1f ms (%.1f ms without memory limits)\n", t.optimal,
              t.optimal_unlimited);
  return 0;
}
