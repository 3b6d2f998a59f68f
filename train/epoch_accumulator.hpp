#pragma once

// Turns step reports into epochs: sums each epoch's loss, samples and
// staleness and says when an epoch, or the run, is over. Pure (no clock of its
// own, no I/O): the sequential loop and the coordinator actor feed it.

#include <chrono>
#include <cstdint>
#include <vector>

#include "train/metrics.hpp"

namespace troupe::train {

/// A worker's report of its steps since its last report (the sequential loop: one step).
struct step_report {
  uint32_t worker = 0;
  uint64_t step = 0;          ///< the worker's steps so far
  double loss = 0;            ///< mean training loss of the steps in this report
  uint64_t samples = 0;       ///< samples trained in this report
  double mean_staleness = 0;  ///< over the shards that answered its push
  uint32_t max_staleness = 0;
  uint32_t rejected = 0;      ///< pushes of this report the shards rejected
  /// Seconds the worker was busy with these steps: forward, backward and
  /// what a step hands to its weight source at its end (its pushes, a local
  /// update), wall clock as they ran (sharing cores included). An
  /// allreduce's optimizer step, run when its last bucket is reduced, is not
  /// in it. 0 when not measured (pipeline stages).
  double compute_s = 0;
  /// The staleness of pushes alone, no step (a hybrid's stages before the
  /// last push to their own shards): epoch_accumulator::add_staleness.
  bool staleness_only = false;
  /// An allreduce's: the epoch of the group the step was applied in (0: the
  /// first); the coordinator counts only the group's that goes on now.
  uint64_t group = 0;
};

class epoch_accumulator {
public:
  using time_point = std::chrono::steady_clock::time_point;
  struct limits {
    int64_t samples_per_epoch = 1;  ///< an epoch ends when this many samples were trained
    int64_t batches_per_epoch = 1;  ///< for progress
    int epochs = 1;
    int first_epoch = 0;            ///< epochs a resumed run skips
    int64_t first_steps = 0;        ///< steps a resumed run had taken
    int64_t max_steps = 0;          ///< 0: no limit
    int workers = 1;
    /// Samples of epoch first_epoch a resumed run had trained (a checkpoint
    /// inside an epoch): that epoch ends after the rest of its samples.
    int64_t first_epoch_samples = 0;
  };
  /// What the caller does after a report.
  enum class verdict { train_on, end_epoch, end_run };

  epoch_accumulator(const limits& l, time_point start);

  /// Adds a report; says whether the epoch in progress (or the run) is over.
  /// Reports after end_run are ignored (the steps finished after a stop).
  verdict add(const step_report& r);
  /// Adds a staleness_only report: its staleness and rejections count in the
  /// epoch's and its worker's (a hybrid's replica's) figures; no step, no samples.
  void add_staleness(const step_report& r);
  /// Workers lost so far (their node died); recorded in the epochs closed from now on.
  void set_lost_workers(int n) { lost_workers_ = n; }
  /// An allreduce's group re-formed (counted in the epoch in progress).
  void count_regroup() { ++regroups_; }
  /// A step report of a replaced group was left out (counted in the epoch in progress).
  void count_dropped_report() { ++dropped_reports_; }
  /// Ends the run at the next report (a callback asked to stop).
  void request_stop() { stop_ = true; }
  bool stopped() const { return done_; }

  /// The record of the epoch in progress (no accuracy, wall time or memory
  /// yet), with `lr` the learning rate at its end; the next epoch starts at `now`.
  epoch_metrics close_epoch(double lr, time_point now);
  /// True when the epoch close_epoch() closed last trained all of its samples
  /// (a run cut by max_steps or a stop ends with a partial epoch).
  bool last_closed_complete() const { return last_complete_; }

  int epoch() const { return epoch_; }  ///< 0-based epoch in progress
  int64_t steps() const { return steps_; }
  /// Samples of the epoch in progress trained so far (before a resume too).
  int64_t epoch_samples() const { return static_cast<int64_t>(samples_); }
  /// Progress of the epoch in progress.
  int64_t batches_done(int64_t batch_size) const { return samples_ / batch_size; }
  double mean_loss() const { return reports_ ? loss_ / reports_ : 0; }
  double samples_per_s(time_point now) const;
  /// Samples each worker trained over the run.
  const std::vector<uint64_t>& worker_samples() const { return worker_samples_; }
  /// Each worker's updates and their staleness over the run (since this accumulator started).
  std::vector<worker_summary> worker_summaries() const;

private:
  limits l_;
  time_point epoch_start_;
  int epoch_;
  int64_t steps_;
  uint64_t samples_ = 0, reports_ = 0;
  uint64_t resumed_samples_ = 0;  // of samples_, those trained before a resume: not in the rate
  double loss_ = 0, tau_sum_ = 0;
  int64_t tau_n_ = 0, tau_max_ = 0, rejected_ = 0, regroups_ = 0, dropped_reports_ = 0;
  int lost_workers_ = 0;
  bool stop_ = false, done_ = false, last_complete_ = false;
  std::vector<uint64_t> worker_samples_;
  struct worker_tally {
    uint64_t updates = 0;
    double compute_s = 0;
    double tau_sum = 0;
    int64_t tau_max = 0;
    std::vector<uint64_t> histogram;  ///< updates per rounded staleness
  };
  std::vector<worker_tally> worker_tau_;

  /// What add() and add_staleness() both count.
  void tally_staleness(const step_report& r);
};

/// When a checkpoint between epochs is due: every `steps` steps and/or every
/// `seconds` seconds since the last one (0: never).
class checkpoint_clock {
public:
  using time_point = std::chrono::steady_clock::time_point;
  checkpoint_clock() = default;
  checkpoint_clock(int64_t steps, double seconds, int64_t first_step, time_point start)
      : every_steps_(steps), every_s_(seconds), last_step_(first_step), last_time_(start) {}
  /// True when one is due at `step`, `now`; the next is then counted from here.
  bool due(int64_t step, time_point now) {
    const bool by_steps = every_steps_ > 0 && step - last_step_ >= every_steps_;
    const bool by_time = every_s_ > 0 && std::chrono::duration<double>(now - last_time_).count() >= every_s_;
    if (!by_steps && !by_time) return false;
    last_step_ = step;
    last_time_ = now;
    return true;
  }

private:
  int64_t every_steps_ = 0;
  double every_s_ = 0;
  int64_t last_step_ = 0;
  time_point last_time_{};
};

} // namespace troupe::train
