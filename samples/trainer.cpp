// Temporary trainer until the CLI11/TOML command line lands (branch job-files).
#include <iostream>
#include <string>

#include "actors/fit.hpp"
#include "model/zoo.hpp"

int main(int argc, char** argv) {
  std::string model = "cnn";
  troupe::settings s;
  try {
    for (int i = 1; i + 1 < argc; i += 2) {
      std::string k = argv[i], v = argv[i + 1];
      if (k == "--model") model = v;
      else if (k == "--algorithm") s.algo.kind = troupe::parse_algorithm(v);
      else if (k == "--workers") s.algo.workers = std::stoi(v);
      else if (k == "--shards") s.algo.shards = std::stoi(v);
      else if (k == "--push-every") s.algo.push_every = std::stoi(v);
      else if (k == "--epochs") s.epochs = std::stoi(v);
      else if (k == "--max-steps") s.max_steps = std::stoll(v);
      else if (k == "--threads") s.threads = std::stoi(v);
      else if (k == "--lr") s.lr = std::stof(v);
      else if (k == "--momentum") s.momentum = std::stof(v);
      else if (k == "--lr-schedule") s.schedule = troupe::parse_schedule(v);
      else if (k == "--progress") s.progress = troupe::parse_progress(v);
      else if (k == "--metrics-out") s.metrics_out = v;
      else if (k == "--checkpoint") s.checkpoint = v;
      else throw troupe::error("unknown option " + k);
    }
    auto job = troupe::job().model([model] { return troupe::zoo::by_name(model); }, model)
                   .data(troupe::data::fashion_mnist()).configure(s);
    troupe::fit(job, std::cerr);
  } catch (const std::exception& e) {
    std::cerr << "troupe_trainer: error: " << e.what() << "\n";
    return 1;
  }
}
