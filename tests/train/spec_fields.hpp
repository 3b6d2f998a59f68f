#pragma once

// Every field of a job_spec as text, written out by hand rather than through
// the key table, so that a key bound to the wrong field shows up in a test.

#include <catch2/catch.hpp>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "train/job_file.hpp"

namespace troupe::testing {

inline std::string exact(float x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(x));
  return buf;
}

inline std::vector<std::pair<std::string, std::string>> fields(const train::job_spec& s) {
  const settings& t = s.train;
  const algorithm_settings& a = t.algo;
  std::string speeds = "[";
  for (float f : a.speeds) speeds += exact(f) + " ";
  return {
      {"model", s.model},
      {"data_dir", s.data_dir},
      {"epochs", std::to_string(t.epochs)},
      {"batch_size", std::to_string(t.batch_size)},
      {"lr", exact(t.lr)},
      {"momentum", exact(t.momentum)},
      {"weight_decay", exact(t.weight_decay)},
      {"schedule", model::to_string(t.schedule)},
      {"seed", std::to_string(t.seed)},
      {"threads", std::to_string(t.threads)},
      {"checkpoint", t.checkpoint},
      {"metrics_out", t.metrics_out},
      {"max_steps", std::to_string(t.max_steps)},
      {"evaluate", t.evaluate ? "true" : "false"},
      {"progress", to_string(t.progress)},
      {"algorithm", to_string(a.kind)},
      {"workers", std::to_string(a.workers)},
      {"shards", std::to_string(a.shards)},
      {"push_every", std::to_string(a.push_every)},
      {"worker_lr", exact(a.worker_lr)},
      {"worker_momentum", exact(a.worker_momentum)},
      {"speeds", speeds + "]"},
      {"prefetch", std::to_string(a.prefetch)},
      {"lambda", exact(a.lambda)},
      {"lambda0", exact(a.lambda0)},
      {"rho_ms", exact(a.rho_ms)},
      {"alpha", exact(a.alpha)},
      {"mu0", exact(a.mu0)},
  };
}

/// The names of the fields in which `a` and `b` differ.
inline std::vector<std::string> differences(const train::job_spec& a, const train::job_spec& b) {
  auto fa = fields(a), fb = fields(b);
  std::vector<std::string> out;
  for (std::size_t i = 0; i < fa.size(); ++i)
    if (fa[i].second != fb[i].second) out.push_back(fa[i].first + ": " + fa[i].second + " vs " + fb[i].second);
  return out;
}

/// A spec in which every field differs from the defaults, and which validates.
inline train::job_spec everything_changed() {
  train::job_spec s;
  s.model = "mlp";
  s.data_dir = "/data/my \"idx\" files\\\ttab #not a comment";
  settings& t = s.train;
  t.epochs = 7;
  t.batch_size = 128;
  t.lr = 0.1f;
  t.momentum = 0.5f;
  t.weight_decay = 1e-4f;
  t.schedule = model::lr_schedule::constant;
  t.seed = 123456789012345;
  t.threads = 3;
  t.checkpoint = "ck.bin";
  t.metrics_out = "run.jsonl";
  t.max_steps = 1000;
  t.evaluate = false;
  t.progress = progress_mode::lines;
  algorithm_settings& a = t.algo;
  a.kind = algorithm_kind::ddc_asgd;
  a.workers = 4;
  a.shards = 2;
  a.push_every = 3;
  a.worker_lr = 0.05f;
  a.worker_momentum = 0.3f;
  a.speeds = {1.0f, 1.5f, 2.0f, 4.0f};
  a.prefetch = 5;
  a.lambda = 0.07f;
  a.lambda0 = 3.3f;
  a.rho_ms = 0.9f;
  a.alpha = 0.31f;
  a.mu0 = 0.8f;
  return s;
}

} // namespace troupe::testing
