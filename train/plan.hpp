#pragma once

// The plan: who runs what where. A pure function of the job's settings, the
// topology (the nodes of a run), the model's parameter layout and the size of
// the training set. Every node of a cluster computes the same plan from the
// same inputs; in one process there is one node.

#include <cstdint>
#include <string>
#include <vector>

#include "model/layout.hpp"
#include "model/model.hpp"
#include "model/placement.hpp"
#include "net/address.hpp"
#include "train/job.hpp"

namespace troupe::train {

/// One node of a run.
struct node_spec {
  std::string name = "local";
  int threads = 1;          ///< CPU threads the node's actors may use (>= 1)
  bool run_workers = true;  ///< may host loaders and workers
  bool run_shards = true;   ///< may host parameter shards
  std::vector<model::device_cost> devices;  ///< its devices (a job file's cluster table); empty: none declared
};

/// The nodes of a run. Node 0 hosts the coordinator and the evaluator.
struct topology {
  std::vector<node_spec> nodes;
  /// A cluster: how long a silent peer lives ([cluster] peer-timeout); 0 in one process.
  double peer_timeout_s = 0;
  /// This process alone, with `threads` threads (0: its share of the cores,
  /// default_threads() of its environment: Slurm's CPUs per task, or the CPUs
  /// it may run on divided by Slurm's tasks on its host).
  static topology local(int threads = 0);
};

/// A data loader: a part of the training set for one worker.
struct loader_plan {
  net::address address, worker;
  int64_t begin = 0, end = 0;  ///< samples [begin, end) of the training set
  uint64_t seed = 0;           ///< shuffles its part, per epoch
};

struct worker_plan {
  net::address address, loader;
  int threads = 1;   ///< kernel threads of its steps
  float speed = 1;   ///< slowdown factor (emulates a slower device)
};

struct shard_plan {
  net::address address;
  model::shard_range range;  ///< its part of the parameter layout
  /// Who pulls from it and pushes to it, in its update rule's worker order:
  /// the workers, or a hybrid's stage `stage` of each pipeline replica. A
  /// holder that answers snapshots only (allreduce's first worker): empty.
  std::vector<net::address> clients;
  /// A hybrid's shard: the pipeline stage whose parameters it holds (a
  /// snapshot's pull waits there for the pushes of the mini-batches it
  /// counts). -1: the workers' shard.
  int stage = -1;
};

/// A pipeline stage: layers [first_layer, last_layer) of the model, and their parameters in the layout.
struct stage_plan {
  net::address address;
  std::size_t first_layer = 0, last_layer = 0;
  model::shard_range params;  ///< empty (first == last) for a stage without parameters
  int threads = 1;            ///< kernel threads of its forward and backward passes
  int device = 0;             ///< its device, an index into plan::devices
  float slowdown = 1;         ///< its device's emulated slowness: fastest speed / its speed (>= 1)
  /// With measured costs on emulated devices: how long a forward and a
  /// backward (with its update) of one micro-batch last on its device, its
  /// layers' time measured alone on this machine x slowdown. An emulated
  /// slower device holds each action's output until then (its compute here
  /// counts towards it, contention of the shared cores included). 0: not
  /// known (estimated costs), the hold is then (slowdown - 1) x the compute.
  double fwd_action_s = 0, bwd_action_s = 0;
  int replica = 0;            ///< a hybrid's pipeline replica (0 without data parallelism)
  int shard = -1;             ///< a hybrid's shard of its parameters (an index into plan::shards); -1: updates them itself
};

/// Per node: how many actors it hosts and the threads of its actor runtime.
struct node_plan {
  int workers = 0, shards = 0, stages = 0;
  int scheduler_threads = 1;
  /// Kernel threads of its shards' updates: a worker's share where workers
  /// run too (the shards run on the same scheduler threads; more OpenMP
  /// threads than cores make libgomp stop spinning), else the node's threads.
  int shard_threads = 1;
};

struct plan {
  net::address coordinator, evaluator;
  std::vector<loader_plan> loaders;   ///< loaders[i] feeds workers[i]
  std::vector<worker_plan> workers;
  std::vector<shard_plan> shards;     ///< empty for Hogwild! (one shared buffer) and a pipeline alone
  model::shard_cut_choice shard_cut;  ///< how the workers' shards cut the layout (--shard-cut resolved)
  /// Allreduce: the worker that answers the evaluator's pulls with its
  /// replica (every replica holds the same values), as one holder of the
  /// whole layout; empty otherwise.
  std::vector<shard_plan> worker_holders;
  /// A pipeline's stages (empty: data parallel): replica r's stage k is
  /// stages[r * K + k], and loaders[r] feeds stages[r * K] (K = stages_per_replica()).
  std::vector<stage_plan> stages;
  int pipeline_replicas = 1;          ///< D: data-parallel replicas of the pipeline (a hybrid when its stages push to shards)
  std::vector<node_plan> nodes;
  int64_t samples_per_epoch = 0;      ///< the training set's size
  int64_t batches_per_epoch = 0;      ///< over all loaders
  int64_t total_updates = 1;          ///< updates a shard applies over the whole run (the lr schedule's length)
  /// A pipeline's devices (--device-speeds, --device-memory) and the cost
  /// model's estimate of its placement (model/placement.hpp): per stage its
  /// time, memory and transfer, and the predicted step time.
  std::vector<model::device_cost> devices;
  std::vector<uint32_t> device_nodes;  ///< the node of each device
  model::placement_estimate estimate;
  /// What differs between one process and a cluster, as the plan's values:
  /// after how long a worker pulls again the shards that did not answer a
  /// push (0: never; a cluster whose rule retries pulls: the peer timeout),
  /// whether the workers share one parameter buffer (Hogwild!, one process
  /// only), whether a placer had measured layer costs (one process) or
  /// estimated ones (a cluster: the same on every node).
  double pull_retry_s = 0;
  bool shared_buffer = false;
  bool costs_measured = false;

  int stages_per_replica() const { return stages.empty() ? 0 : static_cast<int>(stages.size()) / pipeline_replicas; }
  /// The data-parallel replica (its loader's index) of a worker's or stage's address.
  uint32_t replica_of(const net::address& a) const;
  /// Where a snapshot pulls the parameters from: the shards, or a pipeline's stages (index k: stage k).
  std::vector<shard_plan> parameter_holders() const;
  /// The shard holding parameter tensor `tensor` of the layout.
  uint32_t shard_of(std::size_t tensor) const;
  /// A few lines for the log: roles per node, data ranges, shard ranges.
  std::string describe() const;
};

/// A pipeline's placement as the cost model sees it: per stage its layers,
/// device (speed), forward, backward and transfer time, memory, and the
/// predicted step time and bottleneck; a table, or one JSON object (fields
/// placement, devices, stages, bottleneck, predicted_step_s).
std::string describe_placement(const plan& p, const settings& s, bool json);

/// Throws troupe::error when the job cannot run on `t` (no node may host
/// workers or shards, more workers than samples, more shards than parameter
/// tensors, ...), naming what is short. A pipeline (s.pipeline.stages > 1)
/// needs the model's `profile` to cut it, and `costs` (measured per layer,
/// model/cost_profile.hpp) to place it; without them placers use the costs
/// estimated from the profile, the same on every node.
plan make_plan(const settings& s, const topology& t, const model::param_layout& layout, int64_t train_samples,
               const model::model::layer_profile* profile = nullptr,
               const std::vector<model::layer_cost>* costs = nullptr);

} // namespace troupe::train
