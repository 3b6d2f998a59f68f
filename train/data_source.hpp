#pragma once

// Where a job's training and test sets come from: IDX or CIFAR-10 files, or
// samples a program already holds.

#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include "data/dataset.hpp"

namespace troupe::data {

/// A training and a test set, loaded when a run starts.
class source {
public:
  source() = default;
  source(std::function<train_test()> load, std::string description)
      : load_(std::move(load)), description_(std::move(description)) {}
  bool empty() const { return !load_; }
  /// Loads both sets; throws troupe::error naming the file and what is wrong.
  train_test load() const;
  /// Where the data comes from, for logs ("IDX files in /usr/share/...").
  const std::string& description() const { return description_; }

private:
  std::function<train_test()> load_;
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

} // namespace troupe::data
