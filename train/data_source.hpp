#pragma once

// Where a job's training and test sets come from: IDX or CIFAR-10 files,
// samples a program already holds, or text for a language model.

#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include "data/dataset.hpp"
#include "data/text.hpp"

namespace troupe::data {

/// How a language model's text is cut into windows: `context` tokens per
/// window, and an epoch of `windows_per_epoch` random windows of the training
/// part (the corpus is split by text_split_options' defaults: 20 regions, 10 %
/// test, validation as the job's validation_fraction, the same for every seed).
struct text_windows {
  int64_t context = 128;
  int64_t windows_per_epoch = 4096;
};

/// A training and a test set, loaded when a run starts: images (or other
/// samples) with one label each, or a text corpus whose every token is a label
/// (the next one), for a language model.
class source {
public:
  source() = default;
  source(std::function<train_test()> load, std::string description)
      : load_(std::move(load)), description_(std::move(description)) {}
  /// A text corpus for a language model, read when a run starts.
  source(std::function<text_corpus()> load_text, text_windows windows, std::string description)
      : load_text_(std::move(load_text)), windows_(windows), description_(std::move(description)) {}
  bool empty() const { return !load_ && !load_text_; }
  /// True for text (a language model's data): load_text(), not load().
  bool is_text() const { return static_cast<bool>(load_text_); }
  /// Loads both sets; throws troupe::error naming the file and what is wrong.
  train_test load() const;
  /// Reads the corpus of a text source; throws troupe::error naming the file.
  text_corpus load_text() const;
  /// A text source's windows.
  const text_windows& windows() const { return windows_; }
  /// Where the data comes from, for logs ("IDX files in /usr/share/...").
  const std::string& description() const { return description_; }

private:
  std::function<train_test()> load_;
  std::function<text_corpus()> load_text_;
  text_windows windows_;
  std::string description_;
};

/// MNIST or Fashion-MNIST IDX files (gzip'd or not) in `dir`.
source idx_dir(const std::string& dir);
/// Debian's dataset-fashion-mnist package.
source fashion_mnist();
/// CIFAR-10 binary batches (data_batch_1..5.bin, test_batch.bin) in `dir`.
source cifar10_dir(const std::string& dir);
/// Datasets a program built itself (e.g. with from_tensors).
source in_memory(image_dataset train, image_dataset test, std::string description = "in-memory data");
/// Samples a program already holds: x [n, ...] float tensors and their labels.
source in_memory(const tensor& train_x, const std::vector<int32_t>& train_labels, const tensor& test_x,
                 const std::vector<int32_t>& test_labels, int num_classes);

/// A text file, or a directory of them read in sorted order (text_corpus::read),
/// for a language model: windows of `context` tokens (bytes), an epoch of
/// `windows_per_epoch` windows. Throws troupe::error for context < 1 or windows_per_epoch < 1.
source text_file(const std::string& path, int64_t context = 128, int64_t windows_per_epoch = 4096);
/// Debian's fortunes package (data::default_text_dir()), as text_file.
source fortunes(int64_t context = 128, int64_t windows_per_epoch = 4096);
/// Text a program already holds, as text_file.
source text(std::string text, int64_t context = 128, int64_t windows_per_epoch = 4096,
            std::string description = "in-memory text");

} // namespace troupe::data
