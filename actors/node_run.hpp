#pragma once

// One process as node `self` of a cluster: the one path from troupe::fit to
// the roles. A cluster of one node (one process) has no links; everything
// else is the same code. Free of CAF.

#include <cstdint>
#include <iosfwd>

#include "train/cluster_spec.hpp"
#include "train/job.hpp"
#include "train/metrics.hpp"

namespace troupe::actors {

/// Runs node `self` of `c` (`c` of one node or none: this process alone)
/// until the run ends. The coordinator's node returns the records; the others
/// return none. Throws troupe::error (its failure type: diverged, bad input,
/// lost node, timeout) when the run failed.
history run_node(const job& j, const train::cluster_spec& c, uint32_t self, std::ostream& log);

} // namespace troupe::actors
