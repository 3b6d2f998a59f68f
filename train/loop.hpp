#pragma once

// The sequential training loop and what it shares with the actors' runtime:
// loading a job's data, evaluating, the records' common fields.

#include <iosfwd>
#include <memory>
#include <string>

#include "data/dataset.hpp"
#include "data/text.hpp"
#include "kernels/context.hpp"
#include "model/model.hpp"
#include "train/job.hpp"
#include "train/metrics.hpp"

namespace troupe::train {

/// A language model's text, loaded once: the corpus, its train, validation
/// (as the job's validation_fraction; none at 0) and test parts (10 %), split
/// with a fixed seed (the same parts for every job seed), and its windows.
struct text_data {
  data::text_corpus corpus;
  data::text_parts parts;
  data::text_windows windows;
};

/// A job's data, loaded once: both sets, the validation set held out of the
/// training set (empty without --validation-fraction) and the training set's
/// normalization; for text (a language model) `text` instead, the sets empty.
struct loaded_data {
  data::train_test sets;
  data::image_dataset validation;
  data::normalization norm;
  std::shared_ptr<const text_data> text;

  /// One sample's shape: an image's, or a window of `context` tokens.
  shape sample_shape() const;
  /// Training samples in an epoch: images, or a language model's windows.
  int64_t train_samples() const;
  /// The vocabulary a checkpoint of a language model keeps ("" for images).
  std::string vocabulary() const;
};
/// `j`'s model for the data `d`: built for its sample shape, and for a
/// language model also for the text's vocabulary. With `to_load` its
/// parameters' values are not drawn (model::no_initial_draws): a checkpoint
/// is about to overwrite them all.
model::model build_model(const job& j, const loaded_data& d, bool to_load = false);
/// Throws troupe::error when checkpoint `path` holds a `vocabulary` other
/// than `d`'s: token i must mean the same byte as when it was written.
void check_vocabulary(const std::string& path, const std::string& vocabulary, const loaded_data& d);
/// Loads `j`'s data and logs what it loaded.
loaded_data load_data(const job& j, std::ostream& log);

/// What every record of `j`'s run shares; `threads` are the CPU threads it uses.
run_info info_of(const job& j, int threads);

/// How well a model does on a test set.
struct test_score {
  double accuracy = 0;  ///< in [0, 1]; a language model's: of its next-token predictions
  double loss = 0;      ///< mean cross-entropy (a language model's: per token)
  int64_t samples = 0;  ///< samples (a language model's: tokens) scored
};
/// Scores `net` over `test`, in batches of `batch_size`.
test_score score(model::model& net, const kernels::context& ctx, const data::image_dataset& test,
                 const data::normalization& norm, int64_t batch_size);

/// Windows a language model is scored on per part: drawn by a sampler of a
/// fixed seed, the same windows after every epoch and in every run.
constexpr int64_t text_score_windows = 256;
/// Tokens a language model is scored on at once: the activations of a
/// forward pass grow with them, and on actors the evaluator scores while the
/// workers or stages train (the same windows and loss in any batching).
constexpr int64_t text_score_tokens = 1024;
/// Scores language model `net` on `part` of `t` (text_score_windows windows,
/// in batches of `batch_size`, at most text_score_tokens tokens each): mean
/// next-token loss and accuracy over their tokens.
test_score score_text(model::model& net, const kernels::context& ctx, const text_data& t, const data::text_part& part,
                      int64_t batch_size);

/// Accuracy on the test set and, when `d` holds one, the validation set (-1:
/// none); a language model's losses too (-1 for image models).
struct accuracies {
  double test = -1, validation = -1;
  double test_loss = -1, validation_loss = -1;
  std::string sample;  ///< a language model's text (sample_tokens > 0)
};
/// `net` scored on d's test and validation sets; a language model also
/// samples `sample_tokens` tokens after a newline (or its first token: generate's empty prompt) (settings::sample_tokens).
accuracies score_sets(model::model& net, const kernels::context& ctx, const loaded_data& d, int64_t batch_size,
                      int64_t sample_tokens = 0);
/// A language model's losses in `m`: test and validation loss, perplexity,
/// bits per character; and its sample.
void set_losses(epoch_metrics& m, const accuracies& a);

/// Estimates the running statistics of `net`'s batch norm layers (buffers)
/// afresh for its current parameters: `batches` forward passes in training
/// mode over shuffled batches of `train` (seeded by `seed`). A snapshot of
/// parameter shards needs it: workers keep their statistics to themselves.
/// A model without buffers is left alone.
void estimate_batch_norm(model::model& net, const kernels::context& ctx, const data::image_dataset& train,
                         const data::normalization& norm, int64_t batch_size, int64_t batches, uint64_t seed);

/// True when the job names a checkpoint file that exists: the run resumes from it.
bool resumes(const settings& s);

/// Calls the job's epoch callback with `m`; true when it asked to stop.
bool epoch_callback(const job& j, const epoch_metrics& m);

/// Trains `j` in one plain loop on this thread (algorithm sequential).
history run_sequential(const job& j, std::ostream& log);

/// Logs where a run resumes from checkpoint `path` ("resumed from P after
/// epoch E (S steps), N samples into epoch E+1") and returns the samples of
/// epoch E+1 already trained: 0 when the checkpoint is at an epoch's end or
/// its position is past this data set's end (that epoch then starts over).
int64_t log_resume(const std::string& path, int epochs, int64_t steps, int64_t epoch_samples,
                   int64_t samples_per_epoch, std::ostream& log);

} // namespace troupe::train
