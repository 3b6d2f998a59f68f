#pragma once

// Same-host lanes (docs/protocol.md, "Same-host lanes"): between two nodes on
// one machine, a large message's segments travel through a region of shared
// memory that the sender created, and the link carries only a small
// authenticated frame saying where they lie (frame_kind::message_ref). This
// spares both kernels' socket copies and the per-byte tag, which bound
// loopback transfers by CPU. No sockets, threads or clocks here: the
// transport (net/transport.hpp) decides when a lane is used.
//
// The region is a ring of slots. Each slot is a 16-byte header (its state and
// payload size) and the payload. The sender allocates a slot, copies the
// segments in and publishes it; the receiver takes it (written -> taken, once)
// and releases it when the message's last holder lets go; the sender reuses
// released slots in order. A region belongs to one session: a session that
// ends drops it, whatever its slots hold.

#include <capnp/common.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace troupe::net {

/// Bytes of a slot's header before its payload.
constexpr std::size_t lane_slot_header_bytes = 16;
/// Messages from this size on take a lane when one is up.
constexpr std::size_t lane_min_message_bytes = std::size_t(64) << 10;
/// Lane names are at most this long (they travel in a lane_offer frame).
constexpr std::size_t lane_max_name = 64;

/// A lane_offer frame's body: the region's id, its size and its name.
struct lane_offer {
  uint64_t id = 0;
  uint64_t bytes = 0;
  std::string name;
};
std::string encode_lane_offer(const lane_offer& o);
/// Throws error for a body that is not an offer.
lane_offer decode_lane_offer(const void* body, std::size_t bytes);

/// Removes this user's lane regions in `dir` whose creating process is gone
/// (a node killed between its offer and the peer's mapping leaves its region
/// named); returns how many. lane_ring::create() calls it once a process.
std::size_t remove_stale_lanes(const std::string& dir = "/dev/shm");

/// The sending side: a region this process created, cut into slots.
class lane_ring {
public:
  /// Creates and maps a region of `bytes` (rounded up to 4 KiB, at least
  /// 64 KiB) named "/troupe-<pid>-<random>", readable and writable by this
  /// user only, its memory reserved (posix_fallocate: no SIGBUS when
  /// /dev/shm is full). Throws error when it cannot.
  static std::unique_ptr<lane_ring> create(std::size_t bytes);
  ~lane_ring();  ///< unmaps, and removes the name if the peer did not
  lane_ring(const lane_ring&) = delete;
  lane_ring& operator=(const lane_ring&) = delete;

  lane_offer offer() const { return {id_, bytes_, name_}; }
  uint64_t id() const { return id_; }
  std::size_t bytes() const { return bytes_; }

  struct slot {
    uint64_t offset = 0;  ///< of the payload in the region
    std::byte* data = nullptr;
    std::size_t bytes = 0;
  };
  /// A slot for `payload` bytes (a multiple of 8), slots the receiver
  /// released reclaimed first; nullopt when the ring has no room now.
  /// Thread-safe.
  std::optional<slot> allocate(std::size_t payload);
  /// The slot's payload is written: the receiver may take it.
  void publish(const slot& s);
  /// Bytes of slots not yet released (headers included).
  std::size_t in_use() const;

private:
  lane_ring() = default;
  void reclaim();  // under m_

  std::string name_;
  uint64_t id_ = 0;
  std::size_t bytes_ = 0;
  std::byte* base_ = nullptr;
  bool named_ = true;

  mutable std::mutex m_;
  struct used {
    uint64_t at, bytes;  // the slot's header, and its size with the header
  };
  std::deque<used> slots_;  // oldest first
  uint64_t head_ = 0;       // where the next slot starts
  std::size_t in_use_ = 0;
};

/// The receiving side: a peer's region, mapped.
class lane_view : public std::enable_shared_from_this<lane_view> {
public:
  /// Opens the offered region, checks that this user owns it, that it is
  /// `o.bytes` long and not linked elsewhere, maps it and removes its name
  /// (no one else can open it now). Throws error.
  static std::shared_ptr<lane_view> open(const lane_offer& o);
  ~lane_view();
  lane_view(const lane_view&) = delete;
  lane_view& operator=(const lane_view&) = delete;

  uint64_t id() const { return id_; }
  std::size_t bytes() const { return bytes_; }
  /// The published payload of `bytes` at `offset`: sets `words` to it and
  /// returns an owner whose last copy releases the slot. Each slot is taken
  /// once. Returns null with `why` set for an offset or size outside the
  /// region, a header that does not match, or a slot not published or taken.
  std::shared_ptr<const void> take(uint64_t offset, uint64_t bytes, const capnp::word** words, std::string* why);

private:
  lane_view() = default;
  uint64_t id_ = 0;
  std::size_t bytes_ = 0;
  std::byte* base_ = nullptr;
};

} // namespace troupe::net
