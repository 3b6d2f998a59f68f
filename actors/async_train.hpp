#pragma once

// Asynchronous data-parallel training on actors: data loaders, workers,
// parameter shards and a coordinator exchanging Cap'n Proto messages. The
// header is free of CAF so that the trainer and the tests include it cheaply.

#include <iosfwd>
#include <vector>

#include "samples/train_loop.hpp"

namespace troupe::actors {

/// Trains as `o` says with o.algorithm one of ssgd, asgd, sa-asgd, hogwild,
/// dc-asgd-c, dc-asgd-a, ddc-asgd; logs to `log`; returns one record per
/// epoch. Throws troupe::error when the options are invalid, the data cannot
/// be read, or an actor fails (the message says which and why).
std::vector<train::epoch_metrics> run_async(const train::options& o, std::ostream& log);

/// Runs `o` with train::run when o.algorithm is "sequential", else run_async.
std::vector<train::epoch_metrics> run_any(const train::options& o, std::ostream& log);

} // namespace troupe::actors
