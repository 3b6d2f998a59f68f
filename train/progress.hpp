#pragma once

#include <chrono>
#include <functional>
#include <iosfwd>

#include "train/job.hpp"

namespace troupe::train {

/// How a progress_reporter reads the time and how often it reports.
struct progress_options {
  using clock_fn = std::function<std::chrono::steady_clock::time_point()>;
  clock_fn clock = [] { return std::chrono::steady_clock::now(); };  ///< tests give a clock of their own
  double line_every_s = 10;     ///< lines: seconds between lines, the first this long after the first step
  double min_rate_span_s = 2;   ///< an epoch's rate is shown once it has run this long after its first step
};

/// Progress while an epoch runs: on a terminal one bar rewritten in place;
/// elsewhere a plain line every 10 seconds; nothing with progress_mode::none.
/// The rate shown is measured from the end of the epoch's first step (what
/// came before it, start-up or the previous epoch's evaluation, does not
/// count), and only once the epoch has run min_rate_span_s past that step.
class progress_reporter {
public:
  progress_reporter(std::ostream& log, progress_mode mode, progress_options options = {});
  /// `done` of `total` batches of `epoch` trained; `samples_per_s`: the
  /// caller's rate since the epoch began (samples done over time), from which
  /// the rate since the first step is derived.
  void update(int epoch, int epochs, int64_t done, int64_t total, double loss, double samples_per_s);
  /// Ends the bar's line before a regular log line.
  void finish_line();

private:
  using time_point = std::chrono::steady_clock::time_point;
  /// The rate since the epoch's first step, or a negative number while not known.
  double rate_since_first_step(time_point now, int64_t done, double samples_per_s) const;

  std::ostream& log_;
  progress_options options_;
  bool bar_ = false, quiet_ = false, drawn_ = false, started_ = false;
  time_point last_{};         ///< the last line or bar drawn
  int epoch_ = 0;             ///< the epoch of the last update
  time_point first_step_{};   ///< when this epoch's first report came
  int64_t first_done_ = 0;    ///< its batches done and rate then
  double first_rate_ = 0;
};

} // namespace troupe::train
