#pragma once

// Receive buffers that are reused: a frame's segments are read into a pooled,
// 64-byte-aligned buffer and stay there (the message reads them in place); the
// buffer goes back to its pool when the last holder of the message lets go.
// Reuse spares the page faults of fresh large buffers.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

namespace troupe::net {

class buffer_pool;

/// One buffer of a pool: returned to the pool when destroyed (from any thread).
class pooled_buffer {
public:
  pooled_buffer(const pooled_buffer&) = delete;
  pooled_buffer& operator=(const pooled_buffer&) = delete;
  ~pooled_buffer();

  std::byte* data() const { return data_; }
  std::size_t capacity() const { return capacity_; }

private:
  friend class buffer_pool;
  pooled_buffer(std::shared_ptr<buffer_pool> pool, std::byte* data, std::size_t capacity)
      : pool_(std::move(pool)), data_(data), capacity_(capacity) {}
  std::shared_ptr<buffer_pool> pool_;
  std::byte* data_;
  std::size_t capacity_;
};

struct buffer_pool_stats {
  uint64_t allocations = 0;  ///< buffers allocated fresh
  uint64_t reuses = 0;       ///< buffers handed out again
  uint64_t cached_bytes = 0; ///< free bytes the pool holds now
};

/// A thread-safe pool of aligned buffers. Sizes are rounded up (up to 4 MiB to
/// four sizes per octave, a quarter of a power of two apart; then to whole
/// MiB) so that messages of one size share buffers and waste little.
class buffer_pool : public std::enable_shared_from_this<buffer_pool> {
public:
  /// At most `max_cached_bytes` of free buffers are kept; more are freed.
  /// `zeroed`: buffers are handed out all zero, fresh ones zeroed here, and
  /// their holders give them back zero (a Cap'n Proto builder's first
  /// segment: its destructor zeroes what it used).
  static std::shared_ptr<buffer_pool> create(std::size_t max_cached_bytes = std::size_t(512) << 20,
                                             bool zeroed = false);
  ~buffer_pool();

  /// A buffer of at least `bytes` (64-byte aligned), reused when a free one fits.
  std::shared_ptr<pooled_buffer> acquire(std::size_t bytes);
  buffer_pool_stats stats() const;

  /// The capacity acquire(bytes) hands out.
  static std::size_t capacity_for(std::size_t bytes);

private:
  buffer_pool(std::size_t max_cached, bool zeroed) : max_cached_(max_cached), zeroed_(zeroed) {}
  friend class pooled_buffer;
  void release(std::byte* data, std::size_t capacity);

  const std::size_t max_cached_;
  const bool zeroed_;
  mutable std::mutex mutex_;
  std::multimap<std::size_t, std::byte*> free_;  // capacity -> buffer
  buffer_pool_stats stats_;
};

} // namespace troupe::net
