#pragma once

// What a run reports: one record per epoch, written as JSON Lines, described
// in the log, and shown as progress while an epoch runs.

#include <chrono>
#include <cstdint>
#include <fstream>
#include <iosfwd>
#include <map>
#include <string>
#include <vector>

namespace troupe {

/// One epoch of a run.
struct epoch_metrics {
  int epoch = 0;               ///< 1-based
  double train_loss = 0;       ///< mean over the epoch's steps
  double test_accuracy = -1;   ///< in [0, 1]; -1 when not evaluated
  double validation_accuracy = -1;  ///< on the held-out part of the training set; -1 when none
  // A language model's (-1 otherwise, and for image models never in the record;
  // test_accuracy is then the next-token accuracy):
  double test_loss = -1;        ///< mean next-token cross-entropy (nats) on the test part
  double validation_loss = -1;  ///< the same on the validation part; -1 when none
  double perplexity = -1;       ///< exp(test_loss)
  double bits_per_char = -1;    ///< test_loss / ln 2 (tokens are bytes)
  double samples_per_s = 0;    ///< training samples / training seconds of this epoch
  double train_s = 0;          ///< seconds spent training this epoch
  double wall_s = 0;           ///< seconds since the run started
  int64_t steps = 0;           ///< optimizer steps (updates on actors) so far
  double lr = 0;               ///< learning rate at the end of the epoch
  double peak_rss_mb = 0;      ///< peak resident memory of the process so far
  double mean_staleness = 0;   ///< mean staleness of this epoch's updates (0 when sequential)
  int64_t max_staleness = 0;
  int64_t rejected = 0;        ///< pushes the shards rejected this epoch
  int lost_workers = 0;        ///< workers whose node was lost, at the epoch's end (a cluster run)
  // An allreduce run's (in its records only for that algorithm):
  int64_t regroups = 0;        ///< times the group re-formed this epoch (a worker lost or back)
  /// Step reports of a group already replaced this epoch, not counted: a step
  /// that a regroup undid (and the group redid), or a dropped worker's.
  int64_t dropped_reports = 0;
  std::string sample;          ///< a language model's text after the epoch (--sample-tokens); empty: none
  /// A cluster run: what the coordinator's node refused on its links since the
  /// start, by reason ("bad_mac", "bad_tag", "unknown_address", ...)
  std::map<std::string, uint64_t> link_rejections;
};

/// The records of a run, one per epoch.
using history = std::vector<epoch_metrics>;

/// What one data-parallel worker did over a run: its updates and their
/// staleness (each update's mean over the shards that answered it). A
/// hybrid's worker is a pipeline replica: each of its stages' pushes is an update.
struct worker_summary {
  int worker = 0;
  uint64_t samples = 0;
  uint64_t updates = 0;
  double mean_staleness = 0;
  int64_t median_staleness = 0;  ///< of the updates' staleness rounded to integers
  int64_t p90_staleness = 0;
  int64_t max_staleness = 0;
  /// The worker's busy seconds over the run (step_report::compute_s), as it
  /// ran; 0: not measured.
  double compute_s = 0;
};

} // namespace troupe

namespace troupe::train {

/// What every record of a run shares.
struct run_info {
  std::string model;       ///< the job's model name
  std::string algorithm;   ///< "sequential", "asgd", ...
  int epochs = 0;
  int64_t batch_size = 0;
  int threads = 0;         ///< CPU threads the run uses
  int workers = 1;
  int pipeline_stages = 1;
  bool asynchronous = false;     ///< its updates can be stale (on actors, not SSGD or allreduce): the log gives staleness
  bool collective = false;      ///< an allreduce run: its records hold regroups and dropped_reports
  bool language_model = false;  ///< its records hold the losses, perplexity and bits per character
  int64_t tokens_per_sample = 0;  ///< a language model's window (its context): tokens/s = samples/s x it
};

/// The JSON Lines record of one epoch (one line, no newline): epoch, model,
/// train_loss, test_accuracy (null when not evaluated), samples_per_s,
/// validation_accuracy (only with a validation set), train_s, wall_s, steps, lr, batch_size, threads, peak_rss_mb, algorithm,
/// workers, pipeline_stages, mean_staleness, max_staleness, rejected, lost_workers (an allreduce run's
/// then regroups, dropped_reports). Non-finite numbers are null.
/// A language model's record also holds, after validation_accuracy: test_loss, perplexity, bits_per_char
/// (null when not evaluated) and validation_loss (only with a validation set), and after samples_per_s
/// (windows per second) tokens_per_s; test_accuracy is the next-token accuracy.
std::string to_json(const epoch_metrics& m, const run_info& r);

/// The last record of a data-parallel run (one line, no newline):
/// {"workers_summary": [{"worker", "samples", "updates", "mean_staleness",
/// "median_staleness", "p90_staleness", "max_staleness"}, ...], "algorithm", "workers"}.
std::string to_json(const std::vector<worker_summary>& w, const run_info& r);

/// "epoch 2/5: train loss 0.3121, test accuracy 88.10%, 51234 samples/s, 12.3 s"
std::string describe(const epoch_metrics& m, const run_info& r);
/// The log's line on the workers' compute (worker_summary::compute_s) over
/// `train_s` seconds of training: the range of their compute per step and
/// of the share of the training time they were busy (the rest they waited
/// for the network or their turn on the cores). Empty when none measured it.
std::string describe_compute(const std::vector<worker_summary>& w, const run_info& r, double train_s);

/// The metrics file of a run (--metrics-out): one record per line, flushed
/// after each. Closed (writes nothing) when `path` is empty.
class metrics_file {
public:
  /// Opens `path`, appending when the run resumes an earlier one; throws
  /// troupe::error naming the file when it cannot be written.
  metrics_file(const std::string& path, bool append);
  void write(const epoch_metrics& m, const run_info& r);
  void write(const std::vector<worker_summary>& w, const run_info& r);

private:
  void write_line(const std::string& line);
  std::string path_;
  std::ofstream out_;
};

/// Peak resident set size of this process, MiB.
double peak_rss_mb();
/// Seconds since `t` on the steady clock.
double seconds_since(std::chrono::steady_clock::time_point t);

} // namespace troupe::train
