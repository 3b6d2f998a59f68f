// troupe_trainer: trains a reference model on Fashion-MNIST (or MNIST).
//   troupe_trainer --model=cnn --epochs=5 --metrics-out=run.jsonl
#include <cerrno>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "data/dataset.hpp"
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
  };
}

void usage(std::ostream& os, const std::vector<flag>& fs) {
  os << "usage: troupe_trainer [--name=value | --name value]...\n"
        "Trains a reference model on Fashion-MNIST in one process.\n\noptions:\n";
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
    troupe::train::run(o, std::cerr);
  } catch (const std::exception& e) {
    std::cerr << "\ntroupe_trainer: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
