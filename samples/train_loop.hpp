#pragma once

// The single-process training loop behind the trainer binary and the
// benchmarks: data, model, optimizer, evaluation, checkpoints, metrics.

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

namespace troupe::train {

struct options {
  std::string model = "cnn";            ///< zoo model: mlp | cnn
  int epochs = 5;
  int64_t batch_size = 64;
  float lr = 0.02f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;
  std::string lr_schedule = "cosine";   ///< cosine (per step, to 0 at the end) | constant
  uint64_t seed = 1;
  int threads = 0;                      ///< 0: all cores
  std::string data_dir;                 ///< empty: Debian's Fashion-MNIST directory
  std::string checkpoint;               ///< resume from it when it exists; saved every epoch
  std::string metrics_out;              ///< JSON Lines, one record per epoch
  int64_t max_steps = 0;                ///< stop after this many steps (0: no limit)
  bool evaluate = true;                 ///< test accuracy after each epoch
  std::string progress = "auto";        ///< auto (bar on a terminal) | bar | lines | none
};

/// Throws troupe::error describing the first invalid value.
void validate(const options& o);

struct epoch_metrics {
  int epoch = 0;               ///< 1-based
  double train_loss = 0;       ///< mean over the epoch's batches
  double test_accuracy = -1;   ///< in [0, 1]; -1 when not evaluated
  double samples_per_s = 0;    ///< training samples / training seconds of this epoch
  double train_s = 0;          ///< seconds spent training this epoch
  double wall_s = 0;           ///< seconds since the run started
  int64_t steps = 0;           ///< optimizer steps so far
  double lr = 0;               ///< learning rate at the end of the epoch
  double peak_rss_mb = 0;      ///< peak resident memory of the process so far
};

/// Trains as `o` says, logging to `log`; returns one record per epoch run.
std::vector<epoch_metrics> run(const options& o, std::ostream& log);

/// The JSON Lines record written for one epoch.
std::string to_json(const epoch_metrics& m, const options& o);

/// Peak resident set size of this process, MiB.
double peak_rss_mb();

} // namespace troupe::train
