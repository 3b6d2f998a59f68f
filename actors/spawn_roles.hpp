#pragma once

// A node spawns the roles the plan puts on it from one table keyed by role,
// each entry given the same context. Including this costs a CAF compile.

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "actors/directory.hpp"
#include "actors/roles.hpp"
#include "train/bootstrap.hpp"

namespace troupe::actors {

/// What every role of a node is spawned with.
struct node_context {
  std::shared_ptr<const troupe::job> job;
  train::starting_point* start = nullptr;  ///< the node's data, model, plan and initial state
  uint32_t self = 0;                       ///< this node's index
  std::vector<std::string> node_names;     ///< by node index (one process: "local")
  double join_timeout_s = 60;              ///< every node must have joined by then
  train::run_info info;                    ///< what the run's records share
  std::shared_ptr<directory> dir;          ///< address -> actor; every spawned role goes in
  std::shared_ptr<train::tracer> trace;    ///< the run's timeline (--trace), or null
  std::ostream* log = nullptr;             ///< fit's log: outlives the actor system
  std::shared_ptr<outcome> result;         ///< the records, or the error that stopped the run
  std::shared_ptr<net::rejection_log> rejections;  ///< a cluster: what the transport refused; else null
  std::shared_ptr<hogwild_store> hogwild;  ///< Hogwild!'s shared buffer (plan::shared_buffer), else null
  std::vector<caf::actor> locals;          ///< the role actors spawned so far, the coordinator not included

  const train::plan& plan() const { return start->p; }
  const settings& config() const { return job->config(); }
};

/// Spawns every role the plan puts on node `c.self` (the coordinator and the
/// evaluator on the coordinator's node), then the node's own actor, which
/// joins the run. Returns the actor whose end is the node's: the coordinator
/// on its node, else the node's actor.
caf::actor spawn_roles(caf::actor_system& sys, node_context& c);

} // namespace troupe::actors
