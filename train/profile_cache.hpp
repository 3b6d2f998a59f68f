#pragma once

// The layers' measured costs saved to a file (--profile-cache FILE), so that
// another process placing the same model on the same machine (troupe_plan,
// then the trainer) places it on the same costs: timings differ from run to
// run, and a greedy cut can follow them.

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "model/placement.hpp"

namespace troupe::train {

/// What a profile was measured for: the model's architecture, the
/// micro-batch, the threads and this machine's CPU. A file holds one entry
/// per key (up to 32, the oldest dropped first): a key it does not hold is
/// measured and added, and the others stay.
std::string profile_key(const std::string& architecture, const std::string& measured_for);

/// The costs saved in `path` under `key` for a model of `layers` layers;
/// nothing when the file is missing or holds another key. A file that cannot
/// be read as a profile (truncated, non-numeric, negative or non-finite
/// times, another layer count) gives nothing too, and says why in `why`.
std::optional<std::vector<model::layer_cost>> read_profile(const std::string& path, const std::string& key,
                                                           std::size_t layers, std::string* why = nullptr);

/// Saves `costs` under `key` to `path`, beside the other keys' entries there
/// (written to a temporary file, then renamed: a reader never sees half a
/// file; two processes writing at once may lose one's entry, never corrupt
/// the file). Throws troupe::error naming the path when it cannot be written.
void write_profile(const std::string& path, const std::string& key, const std::vector<model::layer_cost>& costs);

/// Measured layer costs kept in memory by key (model, micro-batch, threads),
/// owned by the caller: a program that plans and trains the same model
/// (describe_plan then fit, a sweep) gives its jobs one cache
/// (job::cost_cache) and they place on the same costs. Thread-safe.
class cost_cache {
public:
  /// The costs under `key`, or `measure()`'s, kept under `key` (measured
  /// once however many callers ask at once).
  template <typename Measure>
  std::vector<model::layer_cost> get(const std::string& key, Measure&& measure) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = costs_.find(key);
    if (it == costs_.end()) it = costs_.emplace(key, measure()).first;
    return it->second;
  }
  /// Keys held.
  std::size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return costs_.size();
  }

private:
  mutable std::mutex mutex_;
  std::map<std::string, std::vector<model::layer_cost>> costs_;
};

} // namespace troupe::train
