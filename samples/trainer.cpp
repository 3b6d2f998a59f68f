// troupe_trainer: trains a reference model on Fashion-MNIST (or MNIST).
//   troupe_trainer --model=cnn --epochs=5 --metrics-out=run.jsonl
#include <cerrno>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "data/dataset.hpp"
#include "actors/async_train.hpp"
#include "samples/train_loop.hpp"
#include "tensor/error.hpp"

namespace {

using troupe::error;

struct flag {
  std::string name, value_name, help;
  std::function<void(const std::string&)> set;
};

long long parse_int(const std::string& name, const std::string& v) {
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end || errno) throw error("--" + name + ": '" + v + "' is not an integer");
  return x;
}

float parse_float(const std::string& name, const std::string& v) {
  errno = 0;
  char* end = nullptr;
  float x = std::strtof(v.c_str(), &end);
  if (v.empty() || *end || errno) throw error("--" + name + ": '" + v + "' is not a number");
  return x;
}

std::vector<float> parse_floats(const std::string& name, const std::string& v) {
  std::vector<float> out;
  std::size_t pos = 0;
  while (pos <= v.size()) {
    std::size_t comma = v.find(',', pos);
    if (comma == std::string::npos) comma = v.size();
    out.push_back(parse_float(name, v.substr(pos, comma - pos)));
    pos = comma + 1;
  }
  return out;
}

std::vector<flag> flags(troupe::train::options& o) {
  return {
      {"model", "NAME", "mlp or cnn (default cnn)", [&](auto& v) { o.model = v; }},
      {"epochs", "N", "passes over the training set (default 5)",
       [&](auto& v) { o.epochs = static_cast<int>(parse_int("epochs", v)); }},
      {"batch-size", "N", "samples per step (default 64)",
       [&](auto& v) { o.batch_size = parse_int("batch-size", v); }},
      {"lr", "F", "learning rate (default 0.02)", [&](auto& v) { o.lr = parse_float("lr", v); }},
      {"momentum", "F", "SGD momentum in [0, 1) (default 0.9)",
       [&](auto& v) { o.momentum = parse_float("momentum", v); }},
      {"weight-decay", "F", "L2 weight decay (default 0)",
       [&](auto& v) { o.weight_decay = parse_float("weight-decay", v); }},
      {"lr-schedule", "NAME", "cosine (decays to 0 over the run) or constant (default cosine)", [&](auto& v) { o.lr_schedule = v; }},
      {"seed", "N", "seed for initialisation and shuffling (default 1)",
       [&](auto& v) { o.seed = static_cast<uint64_t>(parse_int("seed", v)); }},
      {"threads", "N", "CPU threads, 0 = all cores (default 0)",
       [&](auto& v) { o.threads = static_cast<int>(parse_int("threads", v)); }},
      {"data-dir", "DIR", "directory with the IDX files (default " + troupe::data::default_fashion_mnist_dir() + ")",
       [&](auto& v) { o.data_dir = v; }},
      {"checkpoint", "FILE", "resume from FILE if it exists; save to it after every epoch",
       [&](auto& v) { o.checkpoint = v; }},
      {"metrics-out", "FILE", "write one JSON record per epoch to FILE (JSON Lines)",
       [&](auto& v) { o.metrics_out = v; }},
      {"max-steps", "N", "stop after N optimizer steps (default 0 = no limit)",
       [&](auto& v) { o.max_steps = parse_int("max-steps", v); }},
      {"progress", "MODE", "auto (a bar on a terminal), bar, lines or none", [&](auto& v) { o.progress = v; }},
      {"algorithm", "NAME",
       "sequential (default, one process, no actors), ssgd, asgd, sa-asgd, hogwild, dc-asgd-c, dc-asgd-a, ddc-asgd",
       [&](auto& v) { o.algorithm = v; }},
      {"workers", "N", "worker actors, each with its own shard of the data (default 1)",
       [&](auto& v) { o.workers = static_cast<int>(parse_int("workers", v)); }},
      {"shards", "S", "parameter shards, balanced by size (default 1)",
       [&](auto& v) { o.shards = static_cast<int>(parse_int("shards", v)); }},
      {"push-every", "K", "local steps per push; K > 1 pushes the accumulated change (default 1)",
       [&](auto& v) { o.push_every = static_cast<int>(parse_int("push-every", v)); }},
      {"worker-lr", "F", "worker optimizer's lr with --push-every > 1 (default: --lr)",
       [&](auto& v) { o.worker_lr = parse_float("worker-lr", v); }},
      {"worker-momentum", "F", "worker optimizer's momentum with --push-every > 1 (default 0)",
       [&](auto& v) { o.worker_momentum = parse_float("worker-momentum", v); }},
      {"speeds", "LIST", "per-worker slowdown factors, e.g. 1,1,2,4 (default all 1)",
       [&](auto& v) { o.speeds = parse_floats("speeds", v); }},
      {"prefetch", "N", "batches a data loader keeps in flight per worker (default 2)",
       [&](auto& v) { o.prefetch = static_cast<int>(parse_int("prefetch", v)); }},
      {"dc-lambda", "F", "DC-ASGD-c: constant lambda (default 0.04)",
       [&](auto& v) { o.rule.lambda = parse_float("dc-lambda", v); }},
      {"dc-lambda0", "F", "DC-ASGD-a, DDC-ASGD: lambda0 (default 2)",
       [&](auto& v) { o.rule.lambda0 = parse_float("dc-lambda0", v); }},
      {"dc-rho-ms", "F", "DC-ASGD-a, DDC-ASGD: decay of the mean square (default 0.95)",
       [&](auto& v) { o.rule.rho_ms = parse_float("dc-rho-ms", v); }},
      {"ddc-alpha", "F", "DDC-ASGD: trust rho(tau) = 1 / (1 + alpha tau) (default 0.2)",
       [&](auto& v) { o.rule.alpha = parse_float("ddc-alpha", v); }},
      {"ddc-mu0", "F", "DDC-ASGD: momentum mu(tau) = max(0, 1 - (1 - mu0)(1 + tau)) (default 0.9)",
       [&](auto& v) { o.rule.mu0 = parse_float("ddc-mu0", v); }},
  };
}

void usage(std::ostream& os, const std::vector<flag>& fs) {
  os << "usage: troupe_trainer [--name=value | --name value]...\n"
        "Trains a reference model on Fashion-MNIST: in one plain loop (--algorithm sequential),\n"
        "or on actors: data loaders, workers and parameter shards exchanging Cap'n Proto messages.\n\noptions:\n";
  for (auto& f : fs) {
    std::string left = "  --" + f.name + " " + f.value_name;
    os << left << std::string(left.size() < 26 ? 26 - left.size() : 1, ' ') << f.help << "\n";
  }
  os << "  --help                  this text\n";
}

} // namespace

int main(int argc, char** argv) {
  troupe::train::options o;
  std::vector<flag> fs = flags(o);
  try {
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg == "--help" || arg == "-h") {
        usage(std::cout, fs);
        return 0;
      }
      if (arg.rfind("--", 0) != 0) throw error("unexpected argument '" + arg + "' (options start with --; see --help)");
      std::string name = arg.substr(2), value;
      bool has_value = false;
      if (auto eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
        has_value = true;
      }
      const flag* f = nullptr;
      for (auto& c : fs)
        if (c.name == name) f = &c;
      if (!f) throw error("unknown option --" + name + " (see --help)");
      if (!has_value) {
        if (i + 1 >= argc) throw error("--" + name + " needs a value (" + f->value_name + ")");
        value = argv[++i];
      }
      f->set(value);
    }
    troupe::train::validate(o);
  } catch (const std::exception& e) {
    std::cerr << "troupe_trainer: " << e.what() << "\n";
    return 2;
  }
  try {
    troupe::actors::run_any(o, std::cerr);
  } catch (const std::exception& e) {
    std::cerr << "\ntroupe_trainer: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
