#pragma once

// Where every role of a run starts: a pure function of the plan, the job's
// settings and the checkpoint a resumed run continues from (none for a fresh
// one). The node's bootstrap hands each role its part; nothing here logs.

#include <cstdint>
#include <string>
#include <vector>

#include "net/checkpoint.hpp"
#include "train/plan.hpp"

namespace troupe::train {

/// Where one parameter holder (a shard, or a stage that updates its own
/// parameters) starts.
struct holder_start {
  uint64_t version = 0;              ///< updates applied before (a shard's version)
  std::vector<named_tensor> state;   ///< its rule's state (a shard) or its flat optimizer's (a stage); empty: fresh
  /// Why it starts fresh although the run resumes (for the log); empty when it resumes or the run is fresh.
  std::string fresh;
  /// A shard whose state was cut again from the checkpoint's other shards: how (for the log).
  std::string recut;
  bool resumes() const { return fresh.empty() && !state.empty(); }
};

/// Where the roles of a run start.
struct initial_state {
  bool resuming = false;
  int first_epoch = 0;           ///< epochs completed before
  int64_t first_steps = 0;       ///< optimizer steps taken before
  /// Samples of epoch first_epoch + 1 trained before the checkpoint: every
  /// loader skips them (0 when the checkpoint's position is past this data set's end).
  int64_t epoch_samples = 0;
  /// Of a position past the data set's end: the samples the checkpoint named (the epoch starts over).
  int64_t epoch_samples_dropped = 0;
  std::vector<holder_start> shards;  ///< by plan::shards
  std::vector<holder_start> stages;  ///< by plan::stages; a hybrid's stages (their shard holds the state) start fresh
  /// Allreduce: where every worker's replica starts (its version: the steps applied before; its optimizer state).
  holder_start replicas;
};

/// A fresh run: every role from the start.
initial_state fresh_start(const plan& p);

/// A run resumed from `c` on plan `p`: shard i takes its version and rule
/// state ("shard<i>/..." entries) when `c` was written by the same algorithm
/// with the same shards; with other shards (another count or --shard-cut) its
/// range of the old shards' states joined (each one value per parameter),
/// at the largest version among the old shards it overlaps; stage i that
/// updates its own parameters takes its optimizer's state
/// ("shard<i>/velocity", or "shard<i>/adamw.moments" with --optimizer adamw)
/// when `c` has one holder per stage; the loaders skip the
/// samples of the epoch in progress; allreduce's replicas take the one
/// holder's version and optimizer state ("shard0/..."). A holder that cannot
/// resume starts fresh, its `fresh` saying why.
initial_state resumed_start(const net::checkpoint& c, const plan& p, const settings& s);

} // namespace troupe::train
