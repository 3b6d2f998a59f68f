#pragma once

// The roles of a run as CAF actors. Each actor owns one CAF-free core
// (loader_core, worker_core, shard_core, evaluator_core) or, for the
// coordinator, the epoch accumulator, and only moves net::message values
// between mailboxes: every message is a Cap'n Proto Envelope addressed by
// (node, role, index) and routed through the node's directory. Including this
// costs a CAF compile: actors/fit.hpp is the cheap entry point.

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/atom.hpp>

#include <chrono>
#include <iosfwd>
#include <memory>

#include "actors/directory.hpp"
#include "actors/evaluator_core.hpp"
#include "actors/loader_core.hpp"
#include "actors/shard_core.hpp"
#include "net/rejection_log.hpp"
#include "actors/stage_core.hpp"
#include "actors/worker_core.hpp"
#include "train/job.hpp"
#include "train/metrics.hpp"
#include "train/plan.hpp"

namespace troupe::actors {

/// Makes Batch messages for its worker, one per credit the worker sends. A
/// loader that cannot make one tells the coordinator why (Control ERROR,
/// with its failure type) and stops, as every role does.
caf::actor spawn_loader(caf::actor_system& sys, std::shared_ptr<loader_core> core, net::address coordinator,
                        std::shared_ptr<const directory> dir);

/// Trains on its loader's batches; reports to the coordinator after every
/// answered push. A plan's speed > 1 holds each step's result (speed - 1) x
/// its compute time, emulating a slower device. With a `reply_timeout` (a
/// cluster: a push or its answer may be lost), it pulls again the shards
/// that have not answered a push in that time.
caf::actor spawn_worker(caf::actor_system& sys, std::shared_ptr<worker_core> core, net::address loader,
                        net::address coordinator, int prefetch, std::chrono::milliseconds reply_timeout,
                        std::shared_ptr<const directory> dir);

/// Answers pulls and pushes; the first rejected message is written to `log`
/// (which must outlive the actor system).
caf::actor spawn_shard(caf::actor_system& sys, std::shared_ptr<shard_core> core,
                       std::shared_ptr<const directory> dir, std::ostream* log);

/// A pipeline stage: runs its schedule as its inputs come (the first stage
/// gives its loader a credit per mini-batch it has taken), reports each
/// finished mini-batch to the coordinator (the last stage), answers the
/// evaluator's pulls with its parameters.
caf::actor spawn_stage(caf::actor_system& sys, std::shared_ptr<stage_core> core, net::address loader,
                       net::address coordinator, int prefetch, std::shared_ptr<const directory> dir);

/// Evaluates and checkpoints snapshots on a thread of its own; answers the coordinator.
caf::actor spawn_evaluator(caf::actor_system& sys, std::shared_ptr<evaluator_core> core, net::address coordinator,
                           std::shared_ptr<const directory> dir);

/// What a run ends with: its records, or the error that stopped it.
struct outcome {
  history epochs;
  std::string error;
  failure kind = failure::other;  ///< what fit throws for `error`
};

/// What the coordinator needs; it shares the job and the outcome with the runtime.
struct coordinator_setup {
  std::shared_ptr<const troupe::job> job;
  train::plan plan;
  train::run_info info;
  int first_epoch = 0;
  int64_t first_steps = 0;
  bool resuming = false;
  std::vector<std::string> node_names;  ///< by node index (one: this process)
  double join_timeout_s = 60;           ///< every node must have joined by then
  std::ostream* log = nullptr;          ///< fit's log stream: outlives the actor system
  std::shared_ptr<outcome> result;
  /// A cluster: what this node's transport refused (for the records); null in one process.
  std::shared_ptr<const net::rejection_log> rejections;
  /// Samples of epoch first_epoch + 1 trained before a resume (a checkpoint inside an epoch).
  int64_t first_epoch_samples = 0;
};

/// Owns epochs and the run's end: waits until every node has joined, sums
/// the workers' reports into epochs, asks the evaluator for a snapshot at
/// every epoch's end, writes the records, goes on without a lost worker node
/// (and takes it back when it joins again), and stops every actor when the
/// run is over, a shard's node is lost or an actor failed.
caf::actor spawn_coordinator(caf::actor_system& sys, coordinator_setup setup, std::shared_ptr<const directory> dir);

/// What a node's own actor needs.
struct node_setup {
  uint32_t self = 0;
  std::vector<std::string> node_names;  ///< by node index
  net::address coordinator;
  double join_timeout_s = 60;
  std::vector<caf::actor> locals;       ///< the node's role actors (not the coordinator)
  std::shared_ptr<outcome> result;      ///< where a node other than the coordinator's records its error
  std::ostream* log = nullptr;
};

/// A node's own actor (address {self, node, 0}): joins the run once the
/// links to every other node are up, tells the coordinator when its node's
/// transport loses a peer, and ends its node: when all its role actors have
/// stopped (it tells the coordinator), or when the coordinator's node is lost.
/// Events of the transport reach it as (peer_up_atom, node) and
/// (peer_down_atom, node, why, goodbye).
caf::actor spawn_node_actor(caf::actor_system& sys, node_setup setup, std::shared_ptr<const directory> dir);

using peer_up_atom = caf::atom_constant<caf::atom("peerup")>;
using peer_down_atom = caf::atom_constant<caf::atom("peerdown")>;
/// Sent to a node's actor once it is in the directory: it may join from then on.
using node_start_atom = caf::atom_constant<caf::atom("nodestart")>;

} // namespace troupe::actors
