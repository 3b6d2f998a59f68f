#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "tensor/error.hpp"

namespace troupe {

/// Where a tensor's storage lives.
enum class device_kind : uint8_t { cpu = 0, cuda = 1 };

/// A device: its kind and, for accelerators, its index.
struct device {
  device_kind kind = device_kind::cpu;
  int index = 0;
  bool operator==(const device& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const device& o) const { return !(*this == o); }
};

std::string to_string(device d);

/// Element type. troupe computes in float32; the tag exists so that codecs and
/// future backends can carry and check it.
enum class dtype : uint8_t { f32 = 0 };

/// The seam a backend plugs into: every tensor's bytes come from the allocator
/// registered for its device kind.
class allocator {
public:
  virtual ~allocator() = default;
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* p, std::size_t bytes) noexcept = 0;
};

/// The allocator for `kind`; throws troupe::error when none is registered
/// (e.g. cuda in a build without CUDA).
allocator& allocator_for(device_kind kind);

/// Registers the allocator used for new tensors on devices of `kind`
/// (nullptr unregisters). The caller keeps `a` alive.
void set_allocator(device_kind kind, allocator* a);

/// The bytes of tensor memory this process may hold on the CPU at once. A CPU
/// tensor that would take the process's tensors past it is not allocated:
/// troupe::error says how much was asked for, held and allowed, where the
/// kernel's OOM killer would otherwise end the process without a word. By
/// default 95 % of the memory available to the process when the first
/// tensor was made: /proc/meminfo's MemAvailable, or its memory cgroup's limit
/// less its usage where that is less (a container's); the environment variable
/// TROUPE_MEMORY_LIMIT sets it in bytes (a K, M or G suffix: powers of 1024),
/// 0 for no limit.
int64_t cpu_memory_limit();
/// Sets that limit (0: none) in place of the default or the environment's.
void set_cpu_memory_limit(int64_t bytes);
/// The bytes of CPU tensor memory this process holds now.
int64_t cpu_memory_in_use();
/// The host's physical memory in bytes (0 where the system does not say).
double physical_memory_bytes();

/// The dimensions of a tensor, outermost first.
class shape {
public:
  shape() = default;
  shape(std::initializer_list<int64_t> dims);
  explicit shape(std::vector<int64_t> dims);

  std::size_t rank() const { return dims_.size(); }
  int64_t operator[](std::size_t i) const { return dims_[i]; }
  int64_t& operator[](std::size_t i) { return dims_[i]; }
  /// Product of the dimensions (1 for a scalar shape).
  int64_t numel() const;
  const std::vector<int64_t>& dims() const { return dims_; }
  bool operator==(const shape& o) const { return dims_ == o.dims_; }
  bool operator!=(const shape& o) const { return dims_ != o.dims_; }
  /// "[64, 1, 28, 28]"
  std::string to_string() const;

private:
  std::vector<int64_t> dims_;
};

/// A block of device memory shared by tensors (views share one).
class storage {
public:
  storage(std::size_t bytes, device dev);
  /// Memory that someone else owns (CPU only): never freed here.
  storage(void* data, std::size_t bytes);
  /// Read-only memory that someone else owns (CPU only), e.g. a received
  /// message: data() throws, cdata() reads.
  storage(const void* data, std::size_t bytes);
  ~storage();
  storage(const storage&) = delete;
  storage& operator=(const storage&) = delete;

  /// The bytes, to write; throws troupe::error for read-only storage.
  void* data() const {
    if (read_only_) fail_read_only();
    return data_;
  }
  const void* cdata() const { return data_; }
  bool read_only() const { return read_only_; }
  std::size_t bytes() const { return bytes_; }
  device dev() const { return dev_; }

private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  device dev_;
  allocator* alloc_ = nullptr;
  bool read_only_ = false;
  [[noreturn]] static void fail_read_only();
};

/// A float32 tensor: a shape over contiguous, ref-counted storage.
/// Copies are shallow (they share storage); use clone() for a deep copy.
class tensor {
public:
  tensor() = default;

  /// Uninitialised tensor of `s` on `dev`.
  static tensor empty(const troupe::shape& s, device dev = {});
  static tensor zeros(const troupe::shape& s, device dev = {});
  static tensor full(const troupe::shape& s, float value, device dev = {});
  /// A CPU tensor holding `values` (its size must match `s`).
  static tensor from(const troupe::shape& s, const std::vector<float>& values);
  /// A CPU tensor over `s.numel()` floats at `data` that it does not own (e.g. a
  /// message's payload, read or written in place): the caller keeps the memory
  /// alive, and drops every copy of the tensor before the memory goes.
  static tensor wrap(const troupe::shape& s, float* data);
  /// Like wrap(), over memory that must not change (a received message's
  /// payload): reading works as usual, the non-const data() throws.
  static tensor wrap_read_only(const troupe::shape& s, const float* data);

  bool defined() const { return static_cast<bool>(storage_); }
  const troupe::shape& shape() const { return shape_; }
  int64_t numel() const { return shape_.numel(); }
  std::size_t rank() const { return shape_.rank(); }
  int64_t dim(std::size_t i) const { return shape_[i]; }
  device dev() const { return storage_ ? storage_->dev() : device{}; }
  dtype type() const { return dtype::f32; }

  float* data() { return storage_ ? static_cast<float*>(storage_->data()) + offset_ : nullptr; }
  const float* data() const {
    return storage_ ? static_cast<const float*>(storage_->cdata()) + offset_ : nullptr;
  }
  /// True for wrap_read_only() tensors and their views.
  bool read_only() const { return storage_ && storage_->read_only(); }
  /// Element access by flat index (CPU tensors only).
  float& at(int64_t i) { return data()[i]; }
  float at(int64_t i) const { return data()[i]; }

  /// A view with another shape and the same number of elements; one
  /// dimension may be -1 and is inferred.
  tensor reshape(const troupe::shape& s) const;
  /// A view of rows [begin, end) of the outermost dimension.
  tensor slice(int64_t begin, int64_t end) const;
  /// A deep copy on the same device.
  tensor clone() const;
  /// Copies the elements of `src` (same number of elements) into this tensor.
  void copy_from(const tensor& src);
  void fill(float value);
  /// True when both tensors view the same storage.
  bool shares_storage(const tensor& o) const { return storage_ == o.storage_; }
  std::vector<float> to_vector() const;

private:
  std::shared_ptr<storage> storage_;
  int64_t offset_ = 0;
  troupe::shape shape_;
};

/// Labels per row of a batch of `dims` [n, ...] that carries `labels` labels:
/// 1 (one per row: an image's class) or T (one per position of a sequence's
/// rows [n, T, ...]: a language model's next tokens); 0 when they fit neither.
/// The one rule for the messages' checks and for the roles that cut batches.
int64_t labels_per_row(const shape& dims, std::size_t labels);

/// A tensor with a name: parameters, optimizer state and checkpoint entries.
struct named_tensor {
  std::string name;
  tensor value;
};

} // namespace troupe
