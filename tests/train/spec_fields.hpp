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

inline std::string exact(int x) { return std::to_string(x); }

template <class T>
std::string list(const std::vector<T>& v) {
  std::string out = "[";
  for (const T& x : v) out += exact(x) + " ";
  return out + "]";
}

inline std::vector<std::pair<std::string, std::string>> fields(const train::job_spec& s) {
  const settings& t = s.train;
  const algorithm_settings& a = t.algo;
  std::string speeds = "[";
  for (float f : a.worker_speeds) speeds += exact(f) + " ";
  std::string cuts = "[";
  for (int c : t.pipeline.cuts) cuts += std::to_string(c) + " ";
  const train::cluster_spec& c = s.cluster;
  std::string nodes = "[";
  for (const auto& n : c.nodes) {
    nodes += n.name + "@" + n.host + ":" + std::to_string(n.port) + (n.workers ? " w" : " -") + (n.shards ? "s" : "-") +
             " t" + std::to_string(n.threads);
    for (const auto& d : n.devices) nodes += " " + d.kind + "/" + std::to_string(d.speed) + "/" + std::to_string(d.memory_mb);
    nodes += "; ";
  }
  return {
      {"model", s.model},
      {"data_dir", s.data_dir},
      {"epochs", std::to_string(t.epochs)},
      {"batch_size", std::to_string(t.batch_size)},
      {"lr", exact(t.lr)},
      {"momentum", exact(t.momentum)},
      {"weight_decay", exact(t.weight_decay)},
      {"optimizer", to_string(t.optimizer)},
      {"gemm", kernels::to_string(t.gemm)},
      {"context", std::to_string(s.context)},
      {"dim", std::to_string(s.dim)},
      {"heads", std::to_string(s.heads)},
      {"blocks", std::to_string(s.blocks)},
      {"mlp_ratio", std::to_string(s.mlp_ratio)},
      {"schedule", model::to_string(t.schedule)},
      {"warmup_steps", std::to_string(t.warmup_steps)},
      {"accumulate", std::to_string(t.accumulate)},
      {"seed", std::to_string(t.seed)},
      {"threads", std::to_string(t.threads)},
      {"checkpoint", t.checkpoint},
      {"metrics_out", t.metrics_out},
      {"checkpoint_every_steps", std::to_string(t.checkpoint_every_steps)},
      {"sample_tokens", std::to_string(t.sample_tokens)},
      {"checkpoint_every_s", std::to_string(t.checkpoint_every_s)},
      {"max_steps", std::to_string(t.max_steps)},
      {"validation_fraction", std::to_string(t.validation_fraction)},
      {"evaluate", t.evaluate ? "true" : "false"},
      {"progress", to_string(t.progress)},
      {"algorithm", to_string(a.kind)},
      {"workers", std::to_string(a.workers)},
      {"shards", std::to_string(a.shards)},
      {"shard_cut", model::to_string(a.shard_cut)},
      {"push_every", std::to_string(a.push_every)},
      {"worker_lr", exact(a.worker_lr)},
      {"worker_momentum", exact(a.worker_momentum)},
      {"worker_speeds", speeds + "]"},
      {"prefetch", std::to_string(a.prefetch)},
      {"overlap", a.overlap ? "true" : "false"},
      {"overlap_receive", a.overlap_receive ? "true" : "false"},
      {"lambda", exact(a.lambda)},
      {"lambda0", exact(a.lambda0)},
      {"rho_ms", exact(a.rho_ms)},
      {"alpha", exact(a.alpha)},
      {"mu0", exact(a.mu0)},
      {"ddc_version", std::to_string(a.ddc_version)},
      {"tau_decay", exact(a.tau_decay)},
      {"bucket_mb", exact(a.bucket_mb)},
      {"clip_grad_norm", exact(t.clip_grad_norm)},
      {"allreduce_dtype", to_string(a.allreduce_dtype)},
      {"pipeline_stages", std::to_string(t.pipeline.stages)},
      {"micro_batches", std::to_string(t.pipeline.micro_batches)},
      {"pipeline_schedule", model::to_string(t.pipeline.schedule)},
      {"pipeline_cuts", cuts + "]"},
      {"stash", std::to_string(t.pipeline.stash)},
      {"placement", to_string(t.pipeline.placement)},
      {"device_speeds", list(t.pipeline.device_speeds)},
      {"device_memory_mb", list(t.pipeline.device_memory_mb)},
      {"stage_devices", list(t.pipeline.stage_devices)},
      {"link_cost", list(t.pipeline.link_cost)},
      {"profile_cache", t.pipeline.profile_cache},
      {"trace", t.trace},
      {"secret_file", c.secret_file},
      {"join_timeout_s", std::to_string(c.join_timeout_s)},
      {"peer_timeout_s", std::to_string(c.peer_timeout_s)},
      {"heartbeat_s", std::to_string(c.heartbeat_s)},
      {"encrypt", std::to_string(c.encrypt)},
      {"slurm_port", std::to_string(c.slurm_port)},
      {"nodes", nodes + "]"},
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
  t.optimizer = optimizer_kind::adamw;
  t.gemm = kernels::gemm_backend::own;
  s.context = 64;
  s.dim = 64;
  s.heads = 8;
  s.blocks = 2;
  s.mlp_ratio = 2;
  t.schedule = model::lr_schedule::constant;
  t.warmup_steps = 20;
  t.accumulate = 3;
  t.seed = 123456789012345;
  t.threads = 3;
  t.checkpoint = "ck.bin";
  t.metrics_out = "run.jsonl";
  t.max_steps = 1000;
  t.sample_tokens = 64;
  t.checkpoint_every_steps = 50;
  t.pipeline.stages = 2;
  t.pipeline.micro_batches = 8;
  t.pipeline.schedule = pipeline_schedule::one_f_one_b;
  t.pipeline.cuts = {3};
  t.pipeline.stash = 3;
  t.pipeline.placement = placement_kind::manual;
  t.pipeline.device_speeds = {1, 2.5f, 4};
  t.pipeline.device_memory_mb = {100, 0, 2048};
  t.pipeline.stage_devices = {2, 0};
  t.pipeline.link_cost = {6.5e-10f, 1.5e-5f};
  t.pipeline.profile_cache = "costs.txt";
  t.trace = "timeline.json";
  t.checkpoint_every_s = 2.5;
  t.validation_fraction = 0.125;
  t.evaluate = false;
  t.progress = progress_mode::lines;
  algorithm_settings& a = t.algo;
  a.kind = algorithm_kind::ddc_asgd;
  a.workers = 4;
  a.shards = 2;
  a.shard_cut = model::shard_cut::even;
  a.push_every = 3;
  a.worker_lr = 0.05f;
  a.worker_momentum = 0.3f;
  a.worker_speeds = {1.0f, 1.5f, 2.0f, 4.0f};
  a.prefetch = 5;
  a.overlap = false;
  a.overlap_receive = false;
  a.lambda = 0.07f;
  a.lambda0 = 3.3f;
  a.rho_ms = 0.9f;
  a.alpha = 0.31f;
  a.mu0 = 0.8f;
  a.ddc_version = 2;
  a.tau_decay = 0.95f;
  a.bucket_mb = 2.5f;
  t.clip_grad_norm = 1.5f;
  a.allreduce_dtype = reduce_dtype::bf16;
  train::cluster_spec& c = s.cluster;
  c.secret_file = "/etc/troupe/secret";
  c.join_timeout_s = 12.5;
  c.peer_timeout_s = 2;
  c.heartbeat_s = 0.25;
  c.encrypt = true;
  c.slurm_port = 9000;
  train::node_entry n0;
  n0.name = "head";
  n0.port = 7001;
  n0.workers = false;
  n0.devices = {{"cpu", 1.5, 2048}};
  train::node_entry n1;
  n1.name = "worker \"one\"";
  n1.host = "10.77.0.2";
  n1.port = 7002;
  n1.shards = false;
  n1.threads = 2;
  n1.devices = {{"cpu", 1.0, 0}, {"cuda", 4.0, 16384}};
  c.nodes = {n0, n1};
  return s;
}

} // namespace troupe::testing
