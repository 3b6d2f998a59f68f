#pragma once

// The nodes of a run as a job file's [cluster] table describes them (plain
// values; train/cluster.hpp reads them).

#include <cstdint>
#include <string>
#include <vector>

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
  bool encrypt = false;               ///< encrypt frames' payloads too (every frame is authenticated either way)
  int64_t lane_mb = 64;               ///< same-host lanes' region per peer, MiB (net/transport.hpp lane_bytes; 0: none)
  int64_t checkpoint_every_steps = 0; ///< also checkpoint every N updates (0: per epoch only)
  double checkpoint_every_s = 0;      ///< also checkpoint every S seconds (0: per epoch only)
  uint16_t slurm_port = 7100;         ///< under Slurm, task i listens on slurm_port + i

  bool single_process() const { return nodes.size() <= 1; }
};

} // namespace troupe::train
