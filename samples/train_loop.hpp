#pragma once

// The single-process training loop behind the trainer binary and the
// benchmarks: data, model, optimizer, evaluation, checkpoints, metrics.

#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include "data/dataset.hpp"
#include "model/model.hpp"
#include "model/update_rule.hpp"

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

  // Asynchronous training (actors/): everything below is ignored by "sequential".
  /// sequential | ssgd | asgd | sa-asgd | hogwild | dc-asgd-c | dc-asgd-a | ddc-asgd
  std::string algorithm = "sequential";
  int workers = 1;
  int shards = 1;                       ///< parameter shards (balanced by size)
  int push_every = 1;                   ///< k local steps per push
  float worker_lr = 0;                  ///< local optimizer with push_every > 1 (0: --lr)
  float worker_momentum = 0;            ///< local optimizer with push_every > 1
  std::vector<float> speeds;            ///< per-worker slowdown factors >= 1 (empty: all 1)
  int prefetch = 2;                     ///< batches a loader may have in flight per worker
  /// Constants of the server update rules (rule, lr and workers are set from the fields above).
  model::update_config rule;

  /// Called after every optimizer step (sequential) or every report of a worker (async), with the loss.
  std::function<void(int64_t step, double loss)> on_step;
};

/// The algorithms --algorithm accepts.
const std::vector<std::string>& algorithms();

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
  double mean_staleness = 0;   ///< mean staleness of this epoch's updates (0 when sequential)
  int64_t max_staleness = 0;
  int64_t rejected = 0;        ///< async: pushes the shards rejected this epoch
  int threads = 0;             ///< threads of the loop's kernel context (async: the evaluation's)
};

/// Trains as `o` says, logging to `log`; returns one record per epoch run.
std::vector<epoch_metrics> run(const options& o, std::ostream& log);

/// The JSON Lines record written for one epoch.
std::string to_json(const epoch_metrics& m, const options& o);

/// Peak resident set size of this process, MiB.
double peak_rss_mb();

// --- pieces shared by the sequential loop and the actors' coordinator ---

/// The training and test sets of `o` (Debian's Fashion-MNIST by default) and
/// the training set's normalization; logs what it loaded.
struct run_data {
  data::train_test sets;
  data::normalization norm;
};
run_data load_data(const options& o, std::ostream& log);
/// The model `o.model` from the zoo, built (weights from `o.seed`) for the images of `train`.
model::model build_model(const options& o, const data::image_dataset& train);

/// Test accuracy of `net` over `test`, in batches of `batch_size`, its kernels run in `ctx`.
double evaluate(const kernels::context& ctx, model::model& net, const data::image_dataset& test,
                const data::normalization& norm, int64_t batch_size);

/// "epoch 2/5: train loss 0.3121, test accuracy 88.10%, 51234 samples/s, 12.3 s"
std::string describe(const epoch_metrics& m, const options& o);

/// Progress on a terminal: one bar rewritten in place; elsewhere a plain line
/// every 10 seconds; nothing with --progress none.
class progress_reporter {
public:
  progress_reporter(std::ostream& log, const std::string& mode);
  void update(int epoch, int epochs, int64_t done, int64_t total, double loss, double samples_per_s);
  /// Ends the bar's line before a regular log line.
  void finish_line();

private:
  std::ostream& log_;
  bool bar_ = false, quiet_ = false, drawn_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  double last_ = 0;
};

/// Seconds since `t` on the steady clock.
double seconds_since(std::chrono::steady_clock::time_point t);
/// True when --checkpoint names a file that exists: the run resumes from it.
bool resumes(const options& o);

/// Opens --metrics-out (appending when resuming); closed stream when not asked for.
void open_metrics(const options& o, bool resuming, std::ofstream& out);
/// Writes one record and flushes; throws when the write fails.
void write_metrics(std::ofstream& out, const epoch_metrics& m, const options& o);

} // namespace troupe::train
