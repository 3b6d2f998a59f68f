#pragma once

// The layers' measured costs saved to a file (--profile-cache FILE), so that
// another process placing the same model on the same machine (troupe_plan,
// then the trainer) places it on the same costs: timings differ from run to
// run, and a greedy cut can follow them.

#include <optional>
#include <string>
#include <vector>

#include "model/placement.hpp"

namespace troupe::train {

/// What a profile was measured for: the model's architecture, the
/// micro-batch, the threads and this machine's CPU. A file of another key
/// is measured again and overwritten.
std::string profile_key(const std::string& architecture, const std::string& measured_for);

/// The costs saved in `path` under `key` for a model of `layers` layers;
/// nothing when the file is missing or holds another key. A file that cannot
/// be read as a profile (truncated, non-numeric, negative or non-finite
/// times, another layer count) gives nothing too, and says why in `why`.
std::optional<std::vector<model::layer_cost>> read_profile(const std::string& path, const std::string& key,
                                                           std::size_t layers, std::string* why = nullptr);

/// Saves `costs` under `key` to `path` (written to a temporary file, then
/// renamed: a reader never sees half a file). Throws troupe::error naming
/// the path when it cannot be written.
void write_profile(const std::string& path, const std::string& key, const std::vector<model::layer_cost>& costs);

} // namespace troupe::train
