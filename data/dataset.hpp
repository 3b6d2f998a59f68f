#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tensor/tensor.hpp"

namespace troupe::data {

/// Samples with one label each. Images read from files are kept as bytes (one
/// byte per pixel and channel, CHW order) and become floats per batch; samples
/// a program already holds (from_tensors) are kept as floats.
struct image_dataset {
  int64_t count = 0;
  int64_t channels = 1;
  int64_t height = 0;
  int64_t width = 0;
  int num_classes = 10;
  std::vector<uint8_t> pixels;  ///< count * channels * height * width bytes
  std::vector<uint8_t> labels;  ///< count bytes, each < num_classes
  std::vector<float> values;    ///< float samples instead of pixels: count * sample_numel()
  std::vector<int64_t> dims;    ///< the shape of one float sample (empty for images)

  int64_t image_bytes() const { return channels * height * width; }
  const uint8_t* image(int64_t i) const { return pixels.data() + i * image_bytes(); }
  /// True when the samples are floats (from_tensors), not image bytes.
  bool floats() const { return !dims.empty(); }
  /// The shape of one sample: [channels, height, width] for images.
  shape sample_shape() const;
};

/// A dataset of samples a program already holds: `x` [n, ...] (each sample of
/// shape x.shape() without its first dimension), labels in [0, num_classes)
/// (at most 256 classes). The values are copied and used as they are: no
/// normalization. Throws troupe::error when the sizes or labels do not fit.
image_dataset from_tensors(const tensor& x, const std::vector<int32_t>& labels, int num_classes);

struct train_test {
  image_dataset train;
  image_dataset test;
};

/// Moves the last `count` samples of `ds` into a new dataset (a held-out
/// validation set: the same samples for every seed) and returns it; `ds`
/// keeps the others. Throws troupe::error unless 0 < count < ds.count.
image_dataset split_off(image_dataset& ds, int64_t count);

/// Where Debian's dataset-fashion-mnist package puts the files.
std::string default_fashion_mnist_dir();

/// Reads an IDX image file (magic 0x00000803) and its IDX label file (magic
/// 0x00000801), gzip'd or not. Throws troupe::error naming the file and what is
/// wrong (missing, bad magic, truncated, counts that disagree, label out of range).
image_dataset read_idx(const std::string& images_path, const std::string& labels_path);

/// Reads train-{images-idx3,labels-idx1}-ubyte[.gz] and t10k-... from `dir`
/// (MNIST and Fashion-MNIST use the same names). A missing directory or file is
/// an error that says which package to install or which option to pass.
train_test load_mnist_dir(const std::string& dir);

/// Reads CIFAR-10 binary batch files (each record: 1 label byte + 3072 pixel
/// bytes). Throws when a file is missing, empty or not a whole number of records.
image_dataset read_cifar10(const std::vector<std::string>& files);

/// Reads data_batch_{1..5}.bin and test_batch.bin from `dir`.
train_test load_cifar10_dir(const std::string& dir);

/// Per-channel normalization applied when bytes become floats:
/// x = (byte / 255 - mean[c]) / stddev[c].
struct normalization {
  std::vector<float> mean{0.0f};
  std::vector<float> stddev{1.0f};
};

/// Mean and standard deviation of each channel of `ds` (on the [0, 1] scale);
/// the identity for float samples (used as they are).
normalization compute_normalization(const image_dataset& ds);

/// A batch: float images [n, c, h, w] and their labels.
struct batch {
  tensor images;
  std::vector<int32_t> labels;
  int64_t size() const { return static_cast<int64_t>(labels.size()); }
};

/// Converts images `indices` of `ds` into `out` (reusing its buffers when
/// their size fits), the images split over `threads` threads when the batch
/// is large enough to be worth a fork (a sequential step's other thread
/// would otherwise wait). `upcoming` (count of them) are the images of the
/// batch after this one: the thread that converts image i asks the memory
/// system for upcoming[i], so that each thread's share of the next batch is in
/// its own core's cache when the step after this one converts it.
void make_batch(const image_dataset& ds, const int64_t* indices, int64_t n,
                const normalization& norm, batch& out, int threads = 1,
                const int64_t* upcoming = nullptr, int64_t upcoming_count = 0);

/// Iterates over a dataset (or a shard of it) in batches, reshuffling each epoch
/// from (seed, epoch) so that runs are reproducible.
class batcher {
public:
  /// `begin`/`end` select a shard [begin, end) of `ds` (default: all of it).
  batcher(const image_dataset& ds, int64_t batch_size, normalization norm, uint64_t seed,
          bool shuffle = true, int64_t begin = 0, int64_t end = -1);

  /// Starts epoch `epoch` (0-based): a fresh permutation when shuffling.
  void start_epoch(int epoch);
  /// Fills `out` with the next batch; false when the epoch is over. The last
  /// batch may be smaller.
  bool next(batch& out);
  /// Samples in the batch next() makes next (0 when the epoch is over): a
  /// caller can hand next() images of that shape to fill in place.
  int64_t next_size() const;
  int64_t batches_per_epoch() const;
  int64_t size() const { return static_cast<int64_t>(order_.size()); }
  /// Threads that next() converts a batch on (make_batch); 1 by default.
  void set_threads(int threads) { threads_ = std::max(1, threads); }

private:
  const image_dataset* ds_;
  int64_t batch_size_;
  normalization norm_;
  uint64_t seed_;
  bool shuffle_;
  std::vector<int64_t> order_;
  int64_t pos_ = 0;
  int threads_ = 1;
};

} // namespace troupe::data
