#pragma once

// The session with one peer (docs/protocol.md, "Between nodes: sessions,
// delivery and liveness") without sockets, threads or clocks: the transport
// (net/transport.hpp) moves the bytes and asks this what a session decides.
//
// Sending: frames wait in a queue (by priority, resent frames first), are
// numbered when first written, then wait for the peer's acknowledgement; the
// queued and unacknowledged bytes are bounded (max_queue_bytes). Receiving:
// each message frame's sequence number is checked against what was delivered,
// duplicates are dropped and gaps counted. A new link after a break either
// resumes the session (the unacknowledged frames go again, in order) or starts
// another; a session that ends drops what was queued or unacknowledged.
//
// Not thread-safe: the transport calls the sending side (admit, enqueue, the
// queue, number, written, interrupted, acknowledge, take, close) under its
// peer's mutex and everything else on its io thread. up() and
// delivered_any_thread() may be read from any thread.

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>

#include "net/auth.hpp"
#include "net/frame.hpp"

namespace troupe::net {

/// Fault injection's decisions for one frame (transport_options::faults): the
/// session keeps them with the frame, across resends, and never reads them.
struct frame_faults {
  bool decided = false, drop = false, delay = false, duplicate = false, disconnect = false, delayed = false;
};

/// A frame waiting to be written (the session queues message frames only).
struct session_frame {
  out_frame f;
  int priority = 0;       ///< lower first among the frames not yet numbered
  bool numbered = false;  ///< its sequence number given: when it is first written
  frame_faults faults{};
};

/// What the sessions of one transport count, together (any thread may read).
struct session_counters {
  std::atomic<uint64_t> resent{0};              ///< frames queued again when a session resumed
  std::atomic<uint64_t> duplicates_dropped{0};  ///< received again (by sequence number), not delivered twice
  std::atomic<uint64_t> lost{0};                ///< gaps in the sequence numbers received
  std::atomic<uint64_t> dropped_at_down{0};     ///< frames queued or unacknowledged when a session ended
  std::atomic<uint32_t> up{0};                  ///< sessions alive now
};

/// admit()'s answer: accepted, or refused because the queue bound is reached.
struct admission {
  bool accepted = true;
  uint64_t held = 0, bytes = 0, limit = 0;  ///< refused: the bytes queued and unacknowledged, asked for, allowed
  explicit operator bool() const { return accepted; }
  std::string what() const;  ///< why it was refused, for the log ("" when accepted)
};

class session {
public:
  /// How take() treated a peer's session, offered by a new link.
  enum class outcome {
    resumed,    ///< the same session goes on: the unacknowledged frames are queued again
    renewed,    ///< a new session; none was alive
    restarted,  ///< a new session; the alive one ended because the peer restarted (another incarnation)
    abandoned,  ///< a new session; the alive one ended because the peer ended it (it had declared this side dead)
  };
  /// A receiver acknowledges at least every this many frames, or bytes (ack_due()).
  static constexpr uint64_t ack_every_frames = 64, ack_every_bytes = uint64_t(8) << 20;

  /// `new_id` gives this side's session ids (nonzero): now and after each close(true).
  session(session_counters& counters, uint64_t max_queue_bytes, std::function<uint64_t()> new_id = random_id);
  session(const session&) = delete;
  session& operator=(const session&) = delete;

  // ---- the session: resume or renew, begin and end ----

  /// What this side says in a handshake: `incarnation` is the transport's.
  session_info offer(uint64_t incarnation) const;
  /// Whether `sent` (an offer()) still names this session: not renewed meanwhile.
  bool offered(const session_info& sent) const;
  /// A link authenticated and the peer offered `their`: resume or start
  /// another (which ends the alive one: counted in dropped_at_down).
  outcome take(const session_info& their);
  /// The session is alive from now on; true when it was not (it began).
  bool open();
  /// Ends the session: what was queued or not acknowledged is dropped (and
  /// counted), numbering starts again; with `renew_ids` this side takes a
  /// new id and forgets the peer's, so that no link resumes it. Returns the
  /// frames dropped.
  std::size_t close(bool renew_ids);
  bool up() const { return up_; }

  // ---- sending ----

  /// Reserves `bytes` of the queue bound for a frame about to be queued or
  /// written; refused, nothing reserved, when the bytes queued and not
  /// acknowledged would exceed max_queue_bytes.
  admission admit(uint64_t bytes);
  /// Queues `q` (admitted) behind the frames to resend and those of a lower
  /// or equal priority value, ahead of the others.
  void enqueue(session_frame q);
  bool queue_empty() const { return queue_.empty(); }
  /// The next frame to write, or null; it stays queued (faults may hold it back).
  session_frame* front() { return queue_.empty() ? nullptr : &queue_.front(); }
  /// Takes the next frame to write, numbered.
  session_frame pop_front();
  /// Gives `q` the next sequence number unless it has one.
  void number(session_frame& q);
  /// `q` (numbered) was written whole: it waits for the acknowledgement, or is
  /// released when the peer acknowledged it already.
  void written(session_frame q);
  /// `q` (numbered) was being written when its link closed: it goes after the
  /// unacknowledged frames, to be sent again if the session resumes.
  void interrupted(session_frame q);
  /// The peer delivered every frame up to `seq`: those are released.
  void acknowledge(uint64_t seq);
  /// The last sequence number given (0: none in this session).
  uint64_t last_sent() const { return next_seq_ - 1; }
  uint64_t queued_bytes() const { return queued_bytes_; }
  std::size_t queued_frames() const { return queue_.size(); }
  std::size_t unacked_frames() const { return unacked_.size(); }

  // ---- receiving ----

  /// Whether message frame `seq` was delivered already: a duplicate, counted, to drop.
  bool duplicate(uint64_t seq);
  /// Message frame `seq` (not a duplicate) of `bytes` is delivered; the
  /// numbers skipped before it are counted lost.
  void deliver(uint64_t seq, uint64_t bytes);
  /// Message frame `seq` (not a duplicate) is handed to no one but counts as
  /// delivered: the sequence goes on, nothing is lost.
  void skip(uint64_t seq);
  /// The last sequence number delivered: what this side acknowledges.
  uint64_t delivered() const { return delivered_; }
  uint64_t delivered_any_thread() const { return delivered_shared_.load(std::memory_order_relaxed); }
  /// Whether enough was delivered since the last acknowledgement to send one now.
  bool ack_due() const { return ack_frames_ >= ack_every_frames || ack_bytes_ >= ack_every_bytes; }
  /// An acknowledgement (of delivered()) was written.
  void ack_sent() { ack_frames_ = ack_bytes_ = 0; }

private:
  bool resumable(const session_info& their) const;
  void resume(uint64_t their_delivered);
  void set_delivered(uint64_t seq);

  session_counters& counters_;
  uint64_t max_queue_bytes_;
  std::function<uint64_t()> new_id_;

  std::deque<session_frame> queue_;    // not yet written: resent frames (numbered) first, then by priority
  std::deque<session_frame> unacked_;  // written, not acknowledged, in sequence order
  uint64_t queued_bytes_ = 0;          // queue, being written and unacknowledged
  uint64_t next_seq_ = 1;
  uint64_t acked_ = 0;

  uint64_t my_sid_ = 0, peer_sid_ = 0, peer_incarnation_ = 0;
  uint64_t delivered_ = 0;
  std::atomic<uint64_t> delivered_shared_{0};  // delivered_, for frames written from other threads
  uint64_t ack_frames_ = 0, ack_bytes_ = 0;    // delivered since this side last acknowledged
  std::atomic<bool> up_{false};
};

} // namespace troupe::net
