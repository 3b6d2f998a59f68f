// The parameter-server actors as CAF actors, for code that runs its own CAF
// actor system (tests, a node of a cluster). Including this costs a CAF
// compile: the trainer and most code use actors/async_train.hpp instead.
#pragma once

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include <iosfwd>
#include <memory>

#include "actors/ps_core.hpp"

namespace troupe::actors {

/// A parameter shard actor serving `workers` workers with `core`. It takes
/// net::message values (PullParams, PushGradient, Control stop) and answers
/// each worker with Params; a rejected message is counted by the core and
/// answered flagged `rejected` (the first rejection is written to `log`).
caf::actor spawn_shard(caf::actor_system& sys, std::shared_ptr<shard_core> core, int workers, std::ostream* log);

} // namespace troupe::actors
