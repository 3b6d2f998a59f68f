#pragma once

#include <iosfwd>
#include <iostream>
#include <string>

#include "train/job.hpp"

namespace troupe {

/// What evaluating a checkpoint found.
struct evaluation {
  double test_accuracy = 0;  ///< in [0, 1]
  double test_loss = 0;      ///< mean cross-entropy over the test set
  int64_t samples = 0;       ///< test samples evaluated
  uint32_t epochs = 0;       ///< epochs the checkpoint had completed
  uint64_t steps = 0;        ///< steps it had taken
};

/// Evaluates the checkpoint at `path` (written by fit for this job's model,
/// sequential or on actors) on the job's test set. Throws troupe::error when
/// the file is missing or corrupt or holds another architecture.
evaluation evaluate(const job& j, const std::string& path, std::ostream& log = std::cerr);

} // namespace troupe
