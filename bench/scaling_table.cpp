// The scaling model (model/scaling.hpp) on the zoo's models: one worker's
// compute measured here (batch 64, one thread), then the predicted step time
// and efficiency of allreduce, SSGD and ASGD for N workers on links of a
// given rate. With --validate, the node-process runs of bench/allreduce_vs_shards.sh
// (this host's cores shared by the node processes: each worker's compute
// x N / cores, and no overlap of buckets with backward beyond one process a core).
// With --row, one run of bench/allreduce_vs_shards.sh: its prediction from the
// compute measured here (x max(1, N / cores), as --validate) and from the
// compute the run's workers measured as they ran (their metrics record's
// compute_ms_per_step), so that the link's model is judged apart from how
// the processes shared the cores.
//   troupe_scaling_table [--validate]
//   troupe_scaling_table --row MODEL N MBIT RUN_COMPUTE_MS ALGORITHM [--shards S] [--shard-cut CUT]
#include <algorithm>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kernels/context.hpp"
#include "model/cost_profile.hpp"
#include "model/layout.hpp"
#include "model/scaling.hpp"
#include "model/zoo.hpp"
#include "tensor/error.hpp"

using namespace troupe;

namespace {

struct measured {
  std::string name;
  model::scaling_inputs in;
  double useful_flop = 0;  ///< per sample, a training step's: see useful_flop_per_sample
  model::param_layout layout;
};

/// A training step's useful floating-point operations per sample: 2 per
/// multiply-add of the layers that have parameters (model::profile's costs:
/// weights x the positions that reuse them), forward once and backward twice
/// (the input's and the weights' gradients), but the first such layer's input
/// gradient, which training does not compute. Direct convolution's count, what
/// Winograd's fewer multiplies are worth.
double useful_flop_per_sample(const model::model& m) {
  const model::model::layer_profile p = m.profile();
  double flop = 0;
  bool first = true;
  for (std::size_t i = 0; i < p.costs.size(); ++i) {
    if (p.tensors[i] == 0) continue;
    flop += 2.0 * static_cast<double>(p.costs[i]) * (first ? 2 : 3);
    first = false;
  }
  return flop;
}

measured measure(const std::string& name) {
  model::model m = zoo::by_name(name);
  m.build({1, 28, 28}, 1);
  const auto costs = model::measure_costs(m, 64, 1, kernels::context::with_threads(1), 5, 1);
  measured out{name, {}, 0, {}};
  model::set_compute(out.in, costs);  // backward with the update
  out.in.bucket_bytes = 1 << 20;  // --bucket-mb 1
  out.in.param_bytes = static_cast<int64_t>(m.num_parameters()) * 4;
  for (const model::parameter* p : m.parameters()) out.in.tensor_bytes.push_back(p->value.numel() * 4);
  out.useful_flop = useful_flop_per_sample(m);
  out.layout = m.layout();
  return out;
}

/// The cores the node processes of a validation run share (this host's).
int host_cores() { return std::max(1u, std::thread::hardware_concurrency()); }

/// N workers on N node processes sharing this host's cores (each worker's compute x max(1, N / cores);
/// with more processes than cores no bucket overlaps backward), links of `mbit` limited by
/// scripts/netns.sh's tbf, which counts each frame with its Ethernet header (model::tcp_link, MTU
/// 1500), b = 50 us (this machine's transport). The model leaves out the tbf's 256 KiB burst, as it
/// does a NIC's buffers (docs/experiments.md: SSGD's phases got it and came out up to 30 % too fast).
model::scaling_inputs validation_inputs(const measured& m, int n, int mbit) {
  model::scaling_inputs in = m.in;
  model::scale_compute(in, std::max(1.0, static_cast<double>(n) / host_cores()));
  in.overlap_backward = n <= host_cores();
  in.link = model::tcp_link(mbit * 1e6, 50e-6, 1500, 14);
  return in;
}

/// Samples/s of `n` workers of batch 64 at `e`'s step.
int samples_per_s(const model::scaling_estimate& e, int n) { return static_cast<int>(64 * n / e.step_s); }

void table(const std::vector<measured>& models, double gbit, double b) {
  std::cout << "\n" << gbit << " Gbit/s (TCP over Ethernet, 1 500-byte frames), " << b * 1e6
            << " us per message; step ms (efficiency)\n\n"
            << "| model | N | allreduce | SSGD, min(N, tensors) shards | ASGD, same shards | ASGD shards to keep up "
               "| SSGD, N shards cut evenly | ASGD, same | ASGD, even: shards to keep up |\n"
            << "|---|---|---|---|---|---|---|---|---|\n";
  for (const measured& m : models)
    for (int n = 8; n <= 1024; n *= 2) {
      model::scaling_inputs in = m.in;
      in.link = model::tcp_link(gbit * 1e9, b, 1500, 38);  // Ethernet on a wire: preamble, FCS and gap
      auto cell = [](const model::scaling_estimate& e) {
        std::ostringstream s;
        s << std::fixed << std::setprecision(2) << e.step_s * 1e3 << " (" << std::setprecision(0)
          << e.efficiency * 100 << " %)";
        return s.str();
      };
      model::scaling_inputs even = in;  // --shard-cut even: equal shares
      even.tensor_bytes.clear();
      std::cout << "| " << m.name << " | " << n << " | " << cell(model::allreduce_estimate(in, n)) << " | "
                << cell(model::ssgd_estimate(in, n, n)) << " | " << cell(model::asgd_estimate(in, n, n)) << " | "
                << model::shards_to_keep_up(in, n, n) << " | " << cell(model::ssgd_estimate(even, n, n)) << " | "
                << cell(model::asgd_estimate(even, n, n)) << " | " << model::shards_to_keep_up(even, n, n) << " |\n";
    }
}

void validate(const std::vector<measured>& models) {
  std::cout << "\npredicted samples/s of N workers on N node processes (global batch 64 N) sharing " << host_cores()
            << " cores (each worker's compute x max(1, N / cores); no overlap with backward beyond one process a "
               "core), N shards (whole tensors), tbf both ways\n\n"
            << "| model | link | N | allreduce | SSGD | ASGD | SSGD, cut evenly | ASGD, cut evenly |\n"
            << "|---|---|---|---|---|---|---|---|\n";
  for (const measured& m : models)
    for (int mbit : {200, 1000})
      for (int n = 2; n <= 4; ++n) {
        const model::scaling_inputs in = validation_inputs(m, n, mbit);
        auto rate = [n](const model::scaling_estimate& e) { return samples_per_s(e, n); };
        model::scaling_inputs even = in;
        even.tensor_bytes.clear();
        std::cout << "| " << m.name << " | " << mbit << " Mbit/s | " << n << " | "
                  << rate(model::allreduce_estimate(in, n)) << " | " << rate(model::ssgd_estimate(in, n, n)) << " | "
                  << rate(model::asgd_estimate(in, n, n)) << " | " << rate(model::ssgd_estimate(even, n, n)) << " | "
                  << rate(model::asgd_estimate(even, n, n)) << " |\n";
      }
}

/// --row: one run's configuration (allreduce, or ssgd / asgd with --shards and
/// --shard-cut as the trainer takes them; the default cut resolved as the
/// trainer's plan resolves it on a cluster), predicted with the compute
/// measured here and with the run's own.
int row(int argc, char** argv) {
  if (argc < 7) throw error("--row MODEL N MBIT RUN_COMPUTE_MS ALGORITHM [--shards S] [--shard-cut CUT]");
  const measured m = measure(argv[2]);
  const int n = std::stoi(argv[3]), mbit = std::stoi(argv[4]);
  const double run_compute_s = std::stod(argv[5]) / 1e3;
  const std::string algorithm = argv[6];
  int shards = 0;
  model::shard_cut asked = model::shard_cut::automatic;
  for (int i = 7; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--shards") == 0) shards = std::stoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--shard-cut") == 0) asked = model::parse_shard_cut(argv[i + 1]);
    else throw error(std::string("--row: unknown option ") + argv[i]);
  }
  const model::scaling_inputs alone = validation_inputs(m, n, mbit);
  model::scaling_inputs ran = alone;
  model::scale_compute(ran, run_compute_s / alone.compute_s);
  const bool all = algorithm == "allreduce";
  if (!all && algorithm != "ssgd" && algorithm != "asgd") throw error("--row: no model of " + algorithm);
  if (!all && shards < 1) throw error("--row: " + algorithm + " needs --shards S");
  const model::shard_cut cut = all ? model::shard_cut::automatic : model::choose_shard_cut(m.layout, shards, asked).cut;
  auto predict = [&](model::scaling_inputs in) {
    if (all) return model::allreduce_estimate(in, n);
    if (cut == model::shard_cut::even) in.tensor_bytes.clear();
    return algorithm == "ssgd" ? model::ssgd_estimate(in, n, shards) : model::asgd_estimate(in, n, shards);
  };
  const model::scaling_estimate a = predict(alone), r = predict(ran);
  std::cout << "predicted " << samples_per_s(a, n) << " samples/s with the compute measured alone ("
            << std::fixed << std::setprecision(2) << alone.compute_s * 1e3 << " ms a step, x max(1, N / " << host_cores() << ")), "
            << samples_per_s(r, n) << " with the run's (" << run_compute_s * 1e3 << " ms); cut "
            << (all ? "-" : model::to_string(cut)) << "\n";
  return 0;
}

} // namespace

int main(int argc, char** argv) try {
  if (argc > 1 && std::strcmp(argv[1], "--row") == 0) return row(argc, argv);
  std::vector<measured> models;
  for (const char* name : {"mlp", "cnn", "resnet"}) {
    models.push_back(measure(name));
    std::cout << name << ": " << models.back().in.param_bytes / 4 << " parameters in "
              << models.back().in.tensor_bytes.size() << " tensors (the largest "
              << *std::max_element(models.back().in.tensor_bytes.begin(), models.back().in.tensor_bytes.end()) / 4
              << "), compute "
              << models.back().in.compute_s * 1e3 << " ms per batch of 64 on one thread, "
              << models.back().useful_flop / 1e6 << " useful MFLOP per sample in a training step\n";
  }
  if (argc > 1 && std::strcmp(argv[1], "--validate") == 0) {
    validate(models);
    return 0;
  }
  for (double gbit : {10.0, 100.0}) table(models, gbit, 20e-6);
  return 0;
} catch (const std::exception& e) {
  std::cerr << "troupe_scaling_table: " << e.what() << "\n";
  return 1;
}
