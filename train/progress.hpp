#pragma once

#include <chrono>
#include <iosfwd>

#include "train/job.hpp"

namespace troupe::train {

/// Progress while an epoch runs: on a terminal one bar rewritten in place;
/// elsewhere a plain line every 10 seconds; nothing with progress_mode::none.
class progress_reporter {
public:
  progress_reporter(std::ostream& log, progress_mode mode);
  void update(int epoch, int epochs, int64_t done, int64_t total, double loss, double samples_per_s);
  /// Ends the bar's line before a regular log line.
  void finish_line();

private:
  std::ostream& log_;
  bool bar_ = false, quiet_ = false, drawn_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  double last_ = 0;
};

} // namespace troupe::train
