#include "tensor/tensor.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <cstring>
#include <mutex>
#include <new>
#include <sstream>

namespace troupe {

std::string to_string(device d) {
  return d.kind == device_kind::cpu ? "cpu" : "cuda:" + std::to_string(d.index);
}

namespace {

/// 64-byte alignment: whole cache lines, and Cap'n Proto's 8-byte rule.
std::size_t rounded(std::size_t bytes) { return (std::max<std::size_t>(bytes, 1) + 63) / 64 * 64; }

/// "3.52 GB", "0.4 MB".
std::string gigabytes(double bytes) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  if (bytes < 1e9) os << std::setprecision(1) << bytes / 1e6 << " MB";
  else os << std::setprecision(2) << bytes / 1e9 << " GB";
  return os.str();
}

/// Bytes from TROUPE_MEMORY_LIMIT's text ("8G", "512M", "1000000"); throws naming it when it is not one.
int64_t parse_limit(const std::string& text) {
  std::size_t end = 0;
  long double v = -1;
  try {
    v = std::stold(text, &end);
  } catch (const std::exception&) {
    end = 0;
  }
  const std::string suffix = end > 0 ? text.substr(end) : "";
  const long double unit = suffix.empty() ? 1 : suffix == "K" ? 1024.0L : suffix == "M" ? 1048576.0L
                                                : suffix == "G" ? 1073741824.0L : -1;
  if (end == 0 || unit < 0 || !(v >= 0) || v * unit > 9e18L)
    throw error("TROUPE_MEMORY_LIMIT=" + text + ": expected bytes, with an optional K, M or G suffix (0: no limit)");
  return static_cast<int64_t>(v * unit);
}

/// The number in file `path` (-1 where it cannot be read, or says "max").
double number_in(const std::string& path) {
  std::ifstream in(path);
  double v = -1;
  return in >> v ? v : -1;
}

/// What the memory cgroup of this process lets it take more: its limit less its usage (cgroup v2's
/// memory.max and memory.current, v1's memory.limit_in_bytes and memory.usage_in_bytes); -1 without a limit.
double cgroup_room() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  double room = -1;
  while (std::getline(in, line)) {  // "0::/path" (v2), "4:memory:/path" (v1)
    const std::size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = "," + line.substr(a + 1, b - a - 1) + ",", path = line.substr(b + 1);
    const bool v2 = controllers == ",,", v1 = controllers.find(",memory,") != std::string::npos;
    if (!v2 && !v1) continue;
    const std::string dir = (v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory") + (path == "/" ? "" : path) + "/";
    const double limit = number_in(dir + (v2 ? "memory.max" : "memory.limit_in_bytes"));
    const double usage = std::max(0.0, number_in(dir + (v2 ? "memory.current" : "memory.usage_in_bytes")));
    if (limit > 0 && limit < 1e18 && (room < 0 || limit - usage < room)) room = std::max(0.0, limit - usage);
  }
  return room;
}

/// 95 % of the memory available to this process: /proc/meminfo's MemAvailable (the physical memory
/// where it cannot be read), or less where its cgroup's limit leaves less.
int64_t default_limit() {
  double available = -1;
  std::ifstream in("/proc/meminfo");
  std::string key;
  long long kb = 0;
  while (available < 0 && in >> key >> kb) {
    if (key == "MemAvailable:") available = static_cast<double>(kb) * 1024;
    in.ignore(256, '\n');
  }
  const double physical = physical_memory_bytes();
  if (available < 0 && physical > 0) available = physical;
  const double room = cgroup_room();
  if (room >= 0 && (available < 0 || room < available)) available = room;
  return available > 0 ? static_cast<int64_t>(available * 0.95) : 0;
}

class cpu_allocator final : public allocator {
public:
  void* allocate(std::size_t bytes) override {
    const auto size = static_cast<int64_t>(rounded(bytes));
    const int64_t held = in_use_.fetch_add(size) + size, max = limit();
    if (max > 0 && held > max) {
      in_use_ -= size;
      throw error("out of memory: a tensor of " + gigabytes(static_cast<double>(bytes)) + " would bring this "
                  "process's tensors to " + gigabytes(static_cast<double>(held)) + ", more than the " +
                  gigabytes(static_cast<double>(max)) + " it may hold (" + source_ +
                  "): a smaller batch or model needs less");
    }
    void* p = std::aligned_alloc(64, static_cast<std::size_t>(size));
    if (!p) {
      in_use_ -= size;
      throw error("out of memory allocating " + std::to_string(bytes) + " bytes on cpu");
    }
    return p;
  }
  void deallocate(void* p, std::size_t bytes) noexcept override {
    std::free(p);
    in_use_ -= static_cast<int64_t>(rounded(bytes));
  }
  int64_t in_use() const { return in_use_.load(); }
  int64_t limit() {
    std::call_once(once_, [&] {
      if (limit_.load() >= 0) return;  // set before the first allocation
      const char* env = std::getenv("TROUPE_MEMORY_LIMIT");
      limit_ = env ? parse_limit(env) : default_limit();
      source_ = env ? std::string("TROUPE_MEMORY_LIMIT=") + env
                    : "95 % of the memory available to it when it started; TROUPE_MEMORY_LIMIT sets it";
    });
    return limit_.load();
  }
  void set_limit(int64_t bytes) {
    std::call_once(once_, [] {});
    source_ = "set by the program";
    limit_ = std::max<int64_t>(bytes, 0);
  }

private:
  std::string source_;  // where the limit comes from, for the error (written before limit_ is)
  std::atomic<int64_t> in_use_{0}, limit_{-1};  // -1: not read yet
  std::once_flag once_;
};

cpu_allocator default_cpu_allocator;
allocator* allocators[2] = {&default_cpu_allocator, nullptr};

void require_cpu(const tensor& t, const char* what) {
  if (t.dev().kind != device_kind::cpu)
    throw error(std::string("tensor::") + what + " is implemented for cpu tensors only, got " +
                to_string(t.dev()));
}

} // namespace

double physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), size = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? static_cast<double>(pages) * static_cast<double>(size) : 0;
}

int64_t cpu_memory_limit() { return default_cpu_allocator.limit(); }
void set_cpu_memory_limit(int64_t bytes) { default_cpu_allocator.set_limit(bytes); }
int64_t cpu_memory_in_use() { return default_cpu_allocator.in_use(); }

allocator& allocator_for(device_kind kind) {
  allocator* a = allocators[static_cast<int>(kind)];
  if (!a)
    throw error("no allocator registered for device " + to_string(device{kind, 0}) +
                " (is this build compiled with TROUPE_CUDA and a GPU present?)");
  return *a;
}

void set_allocator(device_kind kind, allocator* a) {
  allocators[static_cast<int>(kind)] = a ? a : (kind == device_kind::cpu ? &default_cpu_allocator : nullptr);
}

shape::shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
shape::shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

int64_t shape::numel() const {
  int64_t n = 1;
  for (auto d : dims_) n *= d;
  return n;
}

std::string shape::to_string() const {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < dims_.size(); ++i) os << (i ? ", " : "") << dims_[i];
  os << ']';
  return os.str();
}

storage::storage(std::size_t bytes, device dev)
    : bytes_(bytes), dev_(dev), alloc_(&allocator_for(dev.kind)) {
  data_ = alloc_->allocate(bytes);
}

storage::storage(void* data, std::size_t bytes) : data_(data), bytes_(bytes), dev_{} {}

storage::storage(const void* data, std::size_t bytes)
    : data_(const_cast<void*>(data)), bytes_(bytes), dev_{}, read_only_(true) {}

void storage::fail_read_only() {
  throw error("write to a read-only tensor (a view of memory troupe must not change, such as a received "
              "message): clone() it first");
}

storage::~storage() {
  if (alloc_) alloc_->deallocate(data_, bytes_);
}

tensor tensor::wrap(const troupe::shape& s, float* data) {
  for (auto d : s.dims())
    if (d < 0) throw shape_error("tensor::wrap: negative dimension in shape " + s.to_string());
  if (!data && s.numel() > 0) throw shape_error("tensor::wrap: null data for shape " + s.to_string());
  tensor t;
  t.storage_ = std::make_shared<storage>(data, static_cast<std::size_t>(s.numel()) * sizeof(float));
  t.shape_ = s;
  return t;
}

tensor tensor::wrap_read_only(const troupe::shape& s, const float* data) {
  for (auto d : s.dims())
    if (d < 0) throw shape_error("tensor::wrap_read_only: negative dimension in shape " + s.to_string());
  if (!data && s.numel() > 0) throw shape_error("tensor::wrap_read_only: null data for shape " + s.to_string());
  tensor t;
  t.storage_ = std::make_shared<storage>(static_cast<const void*>(data),
                                         static_cast<std::size_t>(s.numel()) * sizeof(float));
  t.shape_ = s;
  return t;
}

tensor tensor::empty(const troupe::shape& s, device dev) {
  for (auto d : s.dims())
    if (d < 0) throw shape_error("tensor::empty: negative dimension in shape " + s.to_string());
  tensor t;
  t.storage_ = std::make_shared<storage>(static_cast<std::size_t>(s.numel()) * sizeof(float), dev);
  t.shape_ = s;
  return t;
}

tensor tensor::zeros(const troupe::shape& s, device dev) { return full(s, 0.0f, dev); }

tensor tensor::full(const troupe::shape& s, float value, device dev) {
  tensor t = empty(s, dev);
  t.fill(value);
  return t;
}

tensor tensor::from(const troupe::shape& s, const std::vector<float>& values) {
  if (static_cast<int64_t>(values.size()) != s.numel())
    throw shape_error("tensor::from: " + std::to_string(values.size()) +
                      " values do not fill shape " + s.to_string());
  tensor t = empty(s);
  std::copy(values.begin(), values.end(), t.data());
  return t;
}

tensor tensor::reshape(const troupe::shape& s) const {
  std::vector<int64_t> dims = s.dims();
  int64_t known = 1;
  int infer = -1;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == -1) {
      if (infer >= 0) throw shape_error("reshape " + s.to_string() + ": more than one -1");
      infer = static_cast<int>(i);
    } else {
      known *= dims[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel() % known != 0)
      throw shape_error("reshape " + shape_.to_string() + " to " + s.to_string() +
                        ": the -1 dimension cannot be inferred");
    dims[infer] = numel() / known;
  }
  troupe::shape out(dims);
  if (out.numel() != numel())
    throw shape_error("reshape " + shape_.to_string() + " (" + std::to_string(numel()) +
                      " elements) to " + s.to_string() + " (" + std::to_string(out.numel()) +
                      " elements)");
  tensor t = *this;
  t.shape_ = out;
  return t;
}

tensor tensor::slice(int64_t begin, int64_t end) const {
  if (rank() == 0 || begin < 0 || end > dim(0) || begin > end)
    throw shape_error("slice [" + std::to_string(begin) + ", " + std::to_string(end) +
                      ") out of range for shape " + shape_.to_string());
  int64_t row = dim(0) ? numel() / dim(0) : 0;
  tensor t = *this;
  t.offset_ = offset_ + begin * row;
  t.shape_[0] = end - begin;
  return t;
}

tensor tensor::clone() const {
  require_cpu(*this, "clone");
  tensor t = empty(shape_, dev());
  std::memcpy(t.data(), data(), static_cast<std::size_t>(numel()) * sizeof(float));
  return t;
}

void tensor::copy_from(const tensor& src) {
  require_cpu(*this, "copy_from");
  require_cpu(src, "copy_from");
  if (src.numel() != numel())
    throw shape_error("copy_from: source " + src.shape().to_string() + " into " + shape_.to_string());
  std::memmove(data(), src.data(), static_cast<std::size_t>(numel()) * sizeof(float));
}

void tensor::fill(float value) {
  require_cpu(*this, "fill");
  std::fill_n(data(), numel(), value);
}

std::vector<float> tensor::to_vector() const {
  require_cpu(*this, "to_vector");
  return std::vector<float>(data(), data() + numel());
}

int64_t labels_per_row(const shape& dims, std::size_t labels) {
  if (dims.rank() == 0 || dims[0] < 1) return 0;
  const auto n = static_cast<std::size_t>(dims[0]);
  if (labels == n) return 1;
  if (dims.rank() >= 2 && labels == n * static_cast<std::size_t>(dims[1])) return dims[1];
  return 0;
}

} // namespace troupe
