#pragma once

// The nodes of a run, as a job file's [cluster] table describes them, and
// which of them this process is: from --node, or from Slurm's environment.
// Pure: the same description gives every node the same topology.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "train/plan.hpp"

namespace troupe::train {

/// A device of a node (used by placement; CPU only so far).
struct device_spec {
  std::string kind = "cpu";
  double speed = 1.0;      ///< relative speed
  int64_t memory_mb = 0;   ///< 0: no limit given
};

/// One node of a cluster.
struct node_entry {
  std::string name;
  std::string host = "127.0.0.1";  ///< where it listens; peers dial it there
  uint16_t port = 0;
  bool workers = true;             ///< may host loaders and workers
  bool shards = true;              ///< may host parameter shards
  int threads = 0;                 ///< CPU threads its actors use, 0: its cores
  std::vector<device_spec> devices;
};

/// A job file's [cluster] table.
struct cluster_spec {
  std::vector<node_entry> nodes;      ///< empty: this process alone
  std::string secret_file;            ///< shared secret (mode 0600); needed with more than one node
  double join_timeout_s = 60;         ///< every node must have joined by then
  double peer_timeout_s = 3;          ///< a peer silent this long is dead
  double heartbeat_s = 0.5;
  int64_t checkpoint_every_steps = 0; ///< also checkpoint every N updates (0: per epoch only)
  double checkpoint_every_s = 0;      ///< also checkpoint every S seconds (0: per epoch only)
  uint16_t slurm_port = 7100;         ///< under Slurm, task i listens on slurm_port + i

  bool single_process() const { return nodes.size() <= 1; }
};

/// Throws troupe::error naming the first problem: duplicate names or
/// host:port pairs, a port of 0, a bad timeout, no secret file with several nodes.
void validate(const cluster_spec& c);

/// The topology the plan is computed on; a node's threads of 0 become
/// `local_threads` for this node and 1 for others (a node knows only its own
/// cores; the plan's roles do not depend on threads).
topology topology_of(const cluster_spec& c, uint32_t self, int local_threads);

/// Which node this process is: `node_name` when given (a name of the
/// cluster), else Slurm's SLURM_PROCID, else node 0 of a one-node cluster.
/// Throws troupe::error for an unknown name, or a cluster of several nodes with
/// neither --node nor Slurm.
uint32_t self_index(const cluster_spec& c, const std::string& node_name, const std::map<std::string, std::string>& env);

/// A cluster of Slurm's tasks: task i is node "task<i>" on the host that
/// Slurm's block distribution gives it (SLURM_TASKS_PER_NODE over the
/// expanded node list), listening on slurm_port + i. `hostnames` is
/// SLURM_JOB_NODELIST expanded (`scontrol show hostnames`). Throws
/// troupe::error when the environment does not describe the tasks.
std::vector<node_entry> slurm_nodes(const std::map<std::string, std::string>& env,
                                    const std::vector<std::string>& hostnames, uint16_t base_port);

/// "2(x3),1" -> {2, 2, 2, 1}: SLURM_TASKS_PER_NODE's tasks per host.
std::vector<int> expand_tasks_per_node(const std::string& s);

} // namespace troupe::train
