#pragma once

// troupe::fit, the one entry point that trains a job: in one plain loop
// (algorithm sequential) or on actors (every other algorithm). Free of CAF, so
// that programs include it cheaply.

#include <iosfwd>
#include <iostream>
#include <string>

#include "train/job.hpp"

namespace troupe {

/// Trains `j` as its algorithm says, logging what it loads, progress and one
/// line per epoch to `log`. Returns one record per epoch run (none when a
/// resumed run had nothing left to do). Throws troupe::error when the job is
/// invalid, the data or a checkpoint cannot be read, or an actor fails (the
/// message says which and why).
history fit(const job& j, std::ostream& log = std::cerr);

/// The plan of `j` without training it (troupe_plan): for a pipeline, each
/// stage's layers, device, predicted forward, backward and transfer time and
/// memory, the predicted step time and the bottleneck, as a table, or with
/// `json` as one JSON object (field predicted_step_s); the layers' times are
/// measured as fit measures them. For data parallelism, the roles per node.
/// Throws troupe::error as fit does for an invalid job, and for a placement
/// that does not fit the devices' memory (naming the device and shortfall).
std::string describe_plan(const job& j, bool json = false);

} // namespace troupe
