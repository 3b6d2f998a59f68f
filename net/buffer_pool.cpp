#include "net/buffer_pool.hpp"

#include <cstring>
#include <new>

namespace troupe::net {

namespace {
constexpr std::align_val_t alignment{64};

std::byte* allocate(std::size_t capacity) { return static_cast<std::byte*>(::operator new(capacity, alignment)); }
void deallocate(std::byte* p) { ::operator delete(p, alignment); }
} // namespace

std::shared_ptr<buffer_pool> buffer_pool::create(std::size_t max_cached_bytes, bool zeroed) {
  return std::shared_ptr<buffer_pool>(new buffer_pool(max_cached_bytes, zeroed));
}

buffer_pool::~buffer_pool() {
  for (auto& [capacity, p] : free_) deallocate(p);
}

std::size_t buffer_pool::capacity_for(std::size_t bytes) {
  constexpr std::size_t mib = std::size_t(1) << 20;
  if (bytes <= 256) return 256;
  if (bytes > 4 * mib) return (bytes + mib - 1) / mib * mib;
  // Four sizes per octave: in (2^k, 2^(k+1)], multiples of 2^(k-2) (at least 64
  // bytes), so that a frame a little over a power of two wastes at most a quarter.
  std::size_t octave = 256;
  while (octave * 2 < bytes) octave <<= 1;
  const std::size_t step = octave / 4;
  return (bytes + step - 1) / step * step;
}

std::shared_ptr<pooled_buffer> buffer_pool::acquire(std::size_t bytes) {
  const std::size_t capacity = capacity_for(bytes);
  std::byte* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.find(capacity);
    if (it != free_.end()) {
      p = it->second;
      free_.erase(it);
      stats_.cached_bytes -= capacity;
      ++stats_.reuses;
    } else {
      ++stats_.allocations;
    }
  }
  if (!p) {
    p = allocate(capacity);
    if (zeroed_) std::memset(p, 0, capacity);
  }
  return std::shared_ptr<pooled_buffer>(new pooled_buffer(shared_from_this(), p, capacity));
}

void buffer_pool::release(std::byte* data, std::size_t capacity) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stats_.cached_bytes + capacity <= max_cached_) {
      free_.emplace(capacity, data);
      stats_.cached_bytes += capacity;
      return;
    }
  }
  deallocate(data);
}

buffer_pool_stats buffer_pool::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

pooled_buffer::~pooled_buffer() { pool_->release(data_, capacity_); }

} // namespace troupe::net
