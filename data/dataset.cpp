#include "data/dataset.hpp"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "tensor/error.hpp"

namespace troupe::data {

namespace {

bool is_dir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool is_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

/// Reads a whole file, gunzipping it when it is gzip'd (zlib reads plain files as is).
std::vector<uint8_t> read_file(const std::string& path) {
  if (!is_file(path)) throw error(path + ": no such file");
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw error(path + ": cannot open");
  std::vector<uint8_t> out;
  std::vector<uint8_t> chunk(1 << 20);
  for (;;) {
    int n = gzread(f, chunk.data(), static_cast<unsigned>(chunk.size()));
    if (n < 0) {
      int code = 0;
      std::string msg = gzerror(f, &code);
      gzclose(f);
      throw error(path + ": corrupt gzip stream (" + msg + ")");
    }
    if (n == 0) break;
    out.insert(out.end(), chunk.begin(), chunk.begin() + n);
  }
  // A truncated gzip file reads as a short stream; zlib reports it at close.
  int rc = gzclose(f);
  if (rc != Z_OK && rc != Z_BUF_ERROR)
    throw error(path + ": corrupt or truncated gzip stream");
  if (rc == Z_BUF_ERROR) throw error(path + ": truncated gzip stream");
  return out;
}

uint32_t be32(const std::vector<uint8_t>& b, std::size_t at) {
  return (uint32_t(b[at]) << 24) | (uint32_t(b[at + 1]) << 16) | (uint32_t(b[at + 2]) << 8) |
         uint32_t(b[at + 3]);
}

std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

std::string first_existing(const std::string& dir, const std::string& name) {
  for (const char* ext : {".gz", ""}) {
    std::string p = dir + "/" + name + ext;
    if (is_file(p)) return p;
  }
  throw error(dir + ": " + name + "[.gz] not found; is this an MNIST/Fashion-MNIST directory? "
                    "Pass --data-dir DIR, or install the Debian package dataset-fashion-mnist");
}

} // namespace

std::string default_fashion_mnist_dir() { return "/usr/share/datasets/fashion-mnist"; }

image_dataset read_idx(const std::string& images_path, const std::string& labels_path) {
  std::vector<uint8_t> img = read_file(images_path);
  std::vector<uint8_t> lab = read_file(labels_path);
  if (img.size() < 16)
    throw error(images_path + ": truncated IDX header (" + std::to_string(img.size()) +
                " bytes, need 16)");
  if (be32(img, 0) != 0x00000803)
    throw error(images_path + ": bad magic " + hex(be32(img, 0)) +
                ", expected 0x00000803 (IDX unsigned-byte 3-D images)");
  if (lab.size() < 8)
    throw error(labels_path + ": truncated IDX header (" + std::to_string(lab.size()) +
                " bytes, need 8)");
  if (be32(lab, 0) != 0x00000801)
    throw error(labels_path + ": bad magic " + hex(be32(lab, 0)) +
                ", expected 0x00000801 (IDX unsigned-byte labels)");

  image_dataset ds;
  ds.count = be32(img, 4);
  ds.height = be32(img, 8);
  ds.width = be32(img, 12);
  ds.channels = 1;
  const uint64_t plane = uint64_t(ds.height) * uint64_t(ds.width);  // both < 2^32: no overflow
  // Compare by division so that a forged header cannot overflow the size check.
  if (plane == 0 || uint64_t(ds.count) > (img.size() - 16) / plane)
    throw error(images_path + ": header says " + std::to_string(ds.count) + " images of " +
                std::to_string(ds.height) + "x" + std::to_string(ds.width) + " but the file has " +
                std::to_string(img.size()) + " bytes: file is truncated or the header is corrupt");
  uint64_t want = 16 + uint64_t(ds.count) * plane;
  if (img.size() != want)
    throw error(images_path + ": size " + std::to_string(img.size()) + " bytes, header says " +
                std::to_string(ds.count) + " images of " + std::to_string(ds.height) + "x" +
                std::to_string(ds.width) + " (" + std::to_string(want) + " bytes): " +
                (img.size() < want ? "file is truncated" : "trailing bytes"));
  int64_t nlab = be32(lab, 4);
  if (lab.size() != 8 + uint64_t(nlab))
    throw error(labels_path + ": size " + std::to_string(lab.size()) + " bytes, header says " +
                std::to_string(nlab) + " labels (" + std::to_string(8 + nlab) + " bytes)");
  if (nlab != ds.count)
    throw error(labels_path + ": " + std::to_string(nlab) + " labels for " +
                std::to_string(ds.count) + " images in " + images_path);
  ds.pixels.assign(img.begin() + 16, img.end());
  ds.labels.assign(lab.begin() + 8, lab.end());
  for (std::size_t i = 0; i < ds.labels.size(); ++i)
    if (ds.labels[i] >= ds.num_classes)
      throw error(labels_path + ": label " + std::to_string(ds.labels[i]) + " at index " +
                  std::to_string(i) + " is out of range [0, " + std::to_string(ds.num_classes) + ")");
  return ds;
}

train_test load_mnist_dir(const std::string& dir) {
  if (!is_dir(dir)) {
    std::string hint = dir == default_fashion_mnist_dir()
                           ? "install it with `apt-get install dataset-fashion-mnist` (scripts/setup.sh does), "
                             "or pass --data-dir DIR"
                           : "pass --data-dir with a directory holding train-images-idx3-ubyte.gz etc.";
    throw error("dataset directory " + dir + " does not exist: " + hint);
  }
  train_test tt;
  tt.train = read_idx(first_existing(dir, "train-images-idx3-ubyte"),
                      first_existing(dir, "train-labels-idx1-ubyte"));
  tt.test = read_idx(first_existing(dir, "t10k-images-idx3-ubyte"),
                     first_existing(dir, "t10k-labels-idx1-ubyte"));
  if (tt.train.height != tt.test.height || tt.train.width != tt.test.width)
    throw error(dir + ": train images are " + std::to_string(tt.train.height) + "x" +
                std::to_string(tt.train.width) + " but test images are " +
                std::to_string(tt.test.height) + "x" + std::to_string(tt.test.width));
  return tt;
}

image_dataset read_cifar10(const std::vector<std::string>& files) {
  constexpr int64_t record = 1 + 3 * 32 * 32;
  image_dataset ds;
  ds.channels = 3;
  ds.height = 32;
  ds.width = 32;
  for (const auto& f : files) {
    std::vector<uint8_t> b = read_file(f);
    if (b.empty() || b.size() % record != 0)
      throw error(f + ": " + std::to_string(b.size()) + " bytes is not a whole number of " +
                  "CIFAR-10 records (" + std::to_string(record) + " bytes each): file is " +
                  (b.empty() ? "empty" : "truncated or not CIFAR-10 binary"));
    int64_t n = static_cast<int64_t>(b.size()) / record;
    for (int64_t i = 0; i < n; ++i) {
      uint8_t label = b[i * record];
      if (label >= ds.num_classes)
        throw error(f + ": record " + std::to_string(i) + " has label " + std::to_string(label) +
                    ", CIFAR-10 labels are 0..9");
      ds.labels.push_back(label);
      ds.pixels.insert(ds.pixels.end(), b.begin() + i * record + 1, b.begin() + (i + 1) * record);
    }
    ds.count += n;
  }
  return ds;
}

train_test load_cifar10_dir(const std::string& dir) {
  if (!is_dir(dir))
    throw error("CIFAR-10 directory " + dir +
                " does not exist: pass --data-dir with the extracted cifar-10-batches-bin directory");
  train_test tt;
  std::vector<std::string> train_files;
  for (int i = 1; i <= 5; ++i) train_files.push_back(dir + "/data_batch_" + std::to_string(i) + ".bin");
  tt.train = read_cifar10(train_files);
  tt.test = read_cifar10({dir + "/test_batch.bin"});
  return tt;
}

shape image_dataset::sample_shape() const {
  return floats() ? shape(dims) : shape{channels, height, width};
}

image_dataset split_off(image_dataset& ds, int64_t count) {
  if (count <= 0 || count >= ds.count)
    throw error("cannot hold out " + std::to_string(count) + " of " + std::to_string(ds.count) +
                " training samples: the validation set and the training set must both be non-empty");
  image_dataset out;
  out.channels = ds.channels;
  out.height = ds.height;
  out.width = ds.width;
  out.num_classes = ds.num_classes;
  out.dims = ds.dims;
  const int64_t keep = ds.count - count;
  const auto tail = [&](auto& from, auto& to, int64_t per_sample) {
    to.assign(from.begin() + keep * per_sample, from.end());
    from.resize(keep * per_sample);
    from.shrink_to_fit();
  };
  const int64_t numel = ds.floats() ? ds.sample_shape().numel() : 0;
  if (ds.floats()) tail(ds.values, out.values, numel);
  else tail(ds.pixels, out.pixels, ds.image_bytes());
  tail(ds.labels, out.labels, 1);
  out.count = count;
  ds.count = keep;
  return out;
}

image_dataset from_tensors(const tensor& x, const std::vector<int32_t>& labels, int num_classes) {
  if (!x.defined() || x.rank() < 2)
    throw error("in-memory dataset: samples must be a tensor [n, ...] of rank >= 2, got " +
                (x.defined() ? x.shape().to_string() : std::string("an undefined tensor")));
  if (x.dev().kind != device_kind::cpu) throw error("in-memory dataset: samples must be a cpu tensor");
  if (x.dim(0) != static_cast<int64_t>(labels.size()))
    throw error("in-memory dataset: " + std::to_string(x.dim(0)) + " samples but " + std::to_string(labels.size()) +
                " labels");
  if (num_classes < 1 || num_classes > 256)
    throw error("in-memory dataset: num_classes must be in [1, 256], got " + std::to_string(num_classes));
  image_dataset ds;
  ds.count = x.dim(0);
  ds.num_classes = num_classes;
  ds.dims.assign(x.shape().dims().begin() + 1, x.shape().dims().end());
  ds.channels = 1;
  ds.values.assign(x.data(), x.data() + x.numel());
  ds.labels.reserve(labels.size());
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] < 0 || labels[i] >= num_classes)
      throw error("in-memory dataset: label " + std::to_string(labels[i]) + " of sample " + std::to_string(i) +
                  " is outside [0, " + std::to_string(num_classes) + ")");
    ds.labels.push_back(static_cast<uint8_t>(labels[i]));
  }
  for (float v : ds.values)
    if (!std::isfinite(v)) throw error("in-memory dataset: the samples hold NaN or Inf");
  return ds;
}

normalization compute_normalization(const image_dataset& ds) {
  if (ds.floats()) return {};
  normalization n;
  n.mean.assign(ds.channels, 0.0f);
  n.stddev.assign(ds.channels, 1.0f);
  int64_t plane = ds.height * ds.width;
  for (int64_t c = 0; c < ds.channels; ++c) {
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < ds.count; ++i) {
      const uint8_t* p = ds.image(i) + c * plane;
      for (int64_t k = 0; k < plane; ++k) {
        double v = p[k] / 255.0;
        s += v;
        s2 += v * v;
      }
    }
    double cnt = double(ds.count) * plane;
    if (cnt == 0) continue;
    double mean = s / cnt;
    double var = std::max(0.0, s2 / cnt - mean * mean);
    n.mean[c] = static_cast<float>(mean);
    n.stddev[c] = var > 0 ? static_cast<float>(std::sqrt(var)) : 1.0f;
  }
  return n;
}

namespace {

/// Float samples: copied, then normalized with one mean and standard deviation.
/// Worth splitting a batch's conversion over threads from this many values on (an MLP batch of
/// 64 Fashion-MNIST images has 50 176).
constexpr int64_t batch_split_values = int64_t{1} << 15;

int batch_threads(int threads, int64_t values) { return values >= batch_split_values ? threads : 1; }

/// Asks for the `bytes` at p: converting the samples of a shuffled batch, which lie anywhere in a data
/// set larger than the cache (Fashion-MNIST: 47 MB), waited on memory for most of its time; asked for a
/// step ahead, they arrive while the step computes.
void prefetch_sample(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 0, 1);
}

void make_float_batch(const image_dataset& ds, const int64_t* indices, int64_t n, const normalization& norm,
                      batch& out, int threads, const int64_t* upcoming, int64_t upcoming_count) {
  const shape sample = ds.sample_shape();
  std::vector<int64_t> dims{n};
  dims.insert(dims.end(), sample.dims().begin(), sample.dims().end());
  const shape s(dims);
  if (!out.images.defined() || out.images.shape() != s) out.images = tensor::empty(s);
  out.labels.resize(n);
  const int64_t per = sample.numel();
  const float mean = norm.mean.empty() ? 0.0f : norm.mean[0];
  const float scale = norm.stddev.empty() ? 1.0f : 1.0f / norm.stddev[0];
  float* images = out.images.data();
#pragma omp parallel for schedule(static) num_threads(batch_threads(threads, n * per))
  for (int64_t i = 0; i < n; ++i) {
    const float* src = ds.values.data() + indices[i] * per;
    float* dst = images + i * per;
    for (int64_t k = 0; k < per; ++k) dst[k] = (src[k] - mean) * scale;
    out.labels[i] = ds.labels[indices[i]];
    if (i < upcoming_count) prefetch_sample(ds.values.data() + upcoming[i] * per, per * 4);
  }
}

} // namespace

void make_batch(const image_dataset& ds, const int64_t* indices, int64_t n,
                const normalization& norm, batch& out, int threads, const int64_t* upcoming,
                int64_t upcoming_count) {
  if (ds.floats()) {
    make_float_batch(ds, indices, n, norm, out, threads, upcoming, upcoming_count);
    return;
  }
  if (static_cast<int64_t>(norm.mean.size()) != ds.channels ||
      static_cast<int64_t>(norm.stddev.size()) != ds.channels)
    throw error("normalization has " + std::to_string(norm.mean.size()) + " channels, dataset " +
                std::to_string(ds.channels));
  shape s{n, ds.channels, ds.height, ds.width};
  if (!out.images.defined() || out.images.shape() != s) out.images = tensor::empty(s);
  out.labels.resize(n);
  const int64_t plane = ds.height * ds.width;
  float* images = out.images.data();
#pragma omp parallel for schedule(static) num_threads(batch_threads(threads, n * ds.channels * plane))
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* src = ds.image(indices[i]);
    float* dst = images + i * ds.channels * plane;
    for (int64_t c = 0; c < ds.channels; ++c) {
      float scale = 1.0f / (255.0f * norm.stddev[c]);
      float shift = -norm.mean[c] / norm.stddev[c];
      for (int64_t k = 0; k < plane; ++k) *dst++ = src[c * plane + k] * scale + shift;
    }
    out.labels[i] = ds.labels[indices[i]];
    if (i < upcoming_count) prefetch_sample(ds.image(upcoming[i]), ds.image_bytes());
  }
}

batcher::batcher(const image_dataset& ds, int64_t batch_size, normalization norm, uint64_t seed,
                 bool shuffle, int64_t begin, int64_t end)
    : ds_(&ds), batch_size_(batch_size), norm_(std::move(norm)), seed_(seed), shuffle_(shuffle) {
  if (batch_size <= 0) throw error("batch size must be positive, got " + std::to_string(batch_size));
  if (end < 0) end = ds.count;
  if (begin < 0 || begin > end || end > ds.count)
    throw error("batcher: shard [" + std::to_string(begin) + ", " + std::to_string(end) +
                ") is outside the dataset of " + std::to_string(ds.count) + " images");
  order_.resize(end - begin);
  std::iota(order_.begin(), order_.end(), begin);
  start_epoch(0);
}

void batcher::start_epoch(int epoch) {
  pos_ = 0;
  if (!shuffle_) return;
  std::sort(order_.begin(), order_.end());
  std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch));
  // Fisher-Yates with our own index draw: std::shuffle's output differs across
  // standard libraries, this does not.
  for (int64_t i = static_cast<int64_t>(order_.size()) - 1; i > 0; --i) {
    int64_t j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
    std::swap(order_[i], order_[j]);
  }
}

int64_t batcher::next_size() const {
  return std::max<int64_t>(0, std::min<int64_t>(batch_size_, static_cast<int64_t>(order_.size()) - pos_));
}

bool batcher::next(batch& out) {
  const int64_t n = next_size();
  if (n == 0) return false;
  const int64_t* indices = order_.data() + pos_;
  pos_ += n;
  make_batch(*ds_, indices, n, norm_, out, threads_, order_.data() + pos_, next_size());
  return true;
}

int64_t batcher::batches_per_epoch() const {
  return (static_cast<int64_t>(order_.size()) + batch_size_ - 1) / batch_size_;
}

} // namespace troupe::data
