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
};

/// Writes `c` to `path` atomically: a temporary file in the same directory,
/// fsync, then rename over `path`. A crash leaves the old file intact.
void save_checkpoint(const std::string& path, const checkpoint& c);

/// Reads a checkpoint; a missing, truncated or corrupt file is a troupe::error
/// naming the file and what is wrong.
checkpoint load_checkpoint(const std::string& path);

} // namespace troupe::net
