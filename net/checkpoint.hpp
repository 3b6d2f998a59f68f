#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensor/tensor.hpp"

namespace troupe::net {

/// What a checkpoint holds (format: net/checkpoint.capnp).
struct checkpoint {
  std::string architecture;             ///< model::architecture()
  uint32_t epoch = 0;                   ///< epochs completed
  uint64_t step = 0;                    ///< optimizer steps taken
  std::vector<named_tensor> params;     ///< model::state()
  std::vector<named_tensor> optimizer;  ///< optimizer::state()
  std::string optimizer_kind;
  std::vector<uint64_t> shard_versions;  ///< asynchronous runs: updates each parameter shard applied
  /// Samples of the epoch in progress (epoch + 1) already trained, for a
  /// checkpoint taken inside an epoch; 0 at an epoch's end. A resumed run
  /// trains the rest of that epoch only.
  uint64_t epoch_samples = 0;
  /// A language model's vocabulary: token i is the byte vocabulary[i] (empty:
  /// not a language model), so that generation decodes as training encoded.
  std::string vocabulary;
};

/// Writes `c` to `path` atomically: a temporary file in the same directory,
/// fsync, then rename over `path`. A crash leaves the old file intact.
void save_checkpoint(const std::string& path, const checkpoint& c);

/// Throws troupe::error ("--checkpoint: cannot write ...: No such file or directory") when
/// save_checkpoint could not write `path` (its directory missing or read-only): a run checks
/// it when it starts, so that a bad path fails before the first epoch's training, not after it.
/// An empty path (no checkpoint) passes.
void check_checkpoint_writable(const std::string& path);

/// Reads a checkpoint; a missing, truncated or corrupt file is a troupe::error
/// naming the file and what is wrong.
checkpoint load_checkpoint(const std::string& path);

/// A 64-bit digest (FNV-1a) of tensors' names, shapes and bytes, in the order
/// given: equal digests say two states are equal bit for bit.
uint64_t state_digest(const std::vector<named_tensor>& ts);

/// Shard `shard`'s entries of an asynchronous run's rule state (checkpoint
/// entries "shard<s>/<name>", the prefix taken off), sorted by name.
std::vector<named_tensor> shard_state(const checkpoint& c, uint32_t shard);

} // namespace troupe::net
