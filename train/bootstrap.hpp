#pragma once

// What a process does before its actors start, the same for one process and
// for every node of a cluster (one process is a cluster of one node): load
// the data and the checkpoint, build the model, make the plan (measuring the
// placer's layer costs in one process), and work out every role's initial
// state. Also the links' options of a cluster node. Free of CAF.

#include <iosfwd>
#include <map>
#include <memory>
#include <string>

#include "net/transport.hpp"
#include "train/cluster_spec.hpp"
#include "train/initial_state.hpp"
#include "train/job.hpp"
#include "train/loop.hpp"
#include "train/plan.hpp"

namespace troupe::train {

/// What a node of a run starts from.
struct starting_point {
  std::shared_ptr<const loaded_data> data;
  /// The model: its parameters the run's start (a checkpoint's when it
  /// resumes); the evaluator's model on the coordinator's node.
  model::model net;
  plan p;
  initial_state state;
  /// A resumed run that has nothing left to do (its checkpoint is at the last epoch).
  bool finished() const;
  int epochs = 0;
};

/// Node `self` of cluster `c` (a cluster of one: this process alone) starts
/// `j`: what it loads, the plan and a resume go to `log`.
starting_point start_of(const job& j, const cluster_spec& c, uint32_t self, std::ostream& log);

/// The plan of `j` on node `self` of `c`, for the model `net` and `data`; the placer's layer costs are measured in one process
/// (`c` of one node: on a model of their own, through the job's cost cache
/// and --profile-cache), estimated on a cluster (the same on every node).
/// Warnings go to `log`.
plan plan_of(const job& j, const cluster_spec& c, uint32_t self, model::model& net, const loaded_data& data,
             std::ostream& log);

/// The plan's lines for the log: the model, the roles, a pipeline's stages and placement.
void log_plan(const job& j, const plan& p, const model::param_layout& layout, std::ostream& log);

/// What every node of a cluster must agree on (nodes of another job refuse each other).
std::string job_identity(const job& j, const cluster_spec& c, const starting_point& start);

/// The links of node `self` of cluster `c`: its peers, the secret, timeouts
/// and the faults to inject for tests from `env` (TROUPE_FAULT_DROP, _DELAY,
/// _DUPLICATE, _DISCONNECT: probabilities; TROUPE_FAULT_SEED).
net::transport_options link_options(const cluster_spec& c, uint32_t self, const std::string& secret,
                                    const std::string& job_hash, const std::map<std::string, std::string>& env);

/// troupe::describe_plan (actors/fit.hpp).
std::string describe_plan(const job& j, bool json);

} // namespace troupe::train
