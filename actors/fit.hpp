#pragma once

// troupe::fit, the one entry point that trains a job: in one plain loop
// (algorithm sequential) or on actors (every other algorithm). Free of CAF, so
// that programs include it cheaply.

#include <iosfwd>
#include <iostream>

#include "train/job.hpp"

namespace troupe {

/// Trains `j` as its algorithm says, logging what it loads, progress and one
/// line per epoch to `log`. Returns one record per epoch run (none when a
/// resumed run had nothing left to do). Throws troupe::error when the job is
/// invalid, the data or a checkpoint cannot be read, or an actor fails (the
/// message says which and why).
history fit(const job& j, std::ostream& log = std::cerr);

} // namespace troupe
