#pragma once

// troupe's links between nodes (docs/protocol.md, "Between nodes: sessions, delivery and liveness"): TCP on
// Boost.Asio, one io thread per transport, authenticated before any frame
// (net/auth.hpp), heartbeats, reconnection, at-least-once delivery within a
// session, fault injection for tests. Asio stays out of this header.
//
// Each node listens on its own port and dials every node with a smaller index:
// one link per pair. A *session* with a peer starts when a link first
// authenticates (on_peer_up) and ends when the peer is silent for
// peer_timeout, says goodbye, or turns out to have restarted (on_peer_down).
// Within a session, a link that breaks is redialed; frames not acknowledged
// are sent again on the next link and the receiver drops the duplicates by
// sequence number. When a session ends, whatever was queued for the peer or not
// acknowledged by it is dropped; sends after that wait for the next session.

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "net/address.hpp"
#include "net/auth.hpp"
#include "net/frame.hpp"
#include "net/message.hpp"

namespace troupe::net {

/// Where a node listens.
struct endpoint {
  std::string name;  ///< for messages ("node-a")
  std::string host;  ///< a host name or address; the node binds it, the others dial it
  uint16_t port = 0;
};

/// Faults injected on outgoing message frames, each with its probability;
/// off by default. Heartbeats and the handshake are never touched.
struct fault_options {
  double drop = 0;       ///< the frame is not written (a lost message: the receiver sees a gap)
  double delay = 0;      ///< the link stalls for `delay_by` before the frame (frames stay in order)
  double duplicate = 0;  ///< the frame is written twice (the receiver drops the copy)
  double disconnect = 0; ///< the link is closed after the frame (a transient error: the session goes on)
  std::chrono::milliseconds delay_by{20};
  uint64_t seed = 1;
  bool any() const { return drop > 0 || delay > 0 || duplicate > 0 || disconnect > 0; }
};

struct transport_options {
  uint32_t self = 0;            ///< this node's index in `nodes`
  std::vector<endpoint> nodes;  ///< every node, the same list on every node
  std::string secret;           ///< the shared secret (read_secret_file)
  std::string job_hash;         ///< nodes with another job hash refuse each other
  std::chrono::milliseconds heartbeat{500};         ///< a link idle this long sends a heartbeat
  std::chrono::milliseconds peer_timeout{3000};     ///< a peer silent this long is dead
  std::chrono::milliseconds connect_timeout{2000};  ///< for a dial, and for a handshake to finish
  uint64_t max_frame_bytes = uint64_t(1) << 30;     ///< larger frames are rejected (either way)
  uint64_t max_queue_bytes = uint64_t(1) << 30;     ///< per peer, queued and unacknowledged; send() refuses more
  std::size_t pool_bytes = std::size_t(512) << 20;  ///< free receive buffers kept for reuse
  /// Every frame after the handshake is authenticated (ChaCha20-Poly1305, per-link
  /// keys); with `encrypt` its payload is also encrypted (AES-256-GCM). Both sides must agree.
  bool encrypt = false;
  /// Same-host lanes (net/shm_lane.hpp): a peer on this host (its link on a
  /// loopback address, or on this socket's own address) gets messages of lane_min_message_bytes or more through a region of
  /// shared memory this large, which this node creates when it first sends
  /// the peer such a message; the link carries a small authenticated frame
  /// per message. 0: never (every byte through the socket).
  std::size_t lane_bytes = std::size_t(64) << 20;
  /// Accepted connections still in their handshake: at most this many in all
  /// and per remote address; a hello that claims a node has its own slots
  /// (pending_per_node each), which connections that said nothing cannot take.
  std::size_t max_pending = 64, max_pending_per_address = 16, pending_per_node = 2;
  /// A frame begun must be whole within peer_timeout + its bytes at this rate
  /// (a peer that trickles a large frame holds no buffer for long).
  double min_frame_bytes_per_s = 1 << 20;
  fault_options faults;
};

/// What the transport refused, for the log and the metrics.
struct rejection {
  std::string remote;      ///< the peer's address ("127.0.0.1:53122"), or "" when unknown
  int64_t node = -1;       ///< the node the link is with, or claims to be (unauthenticated before the proof); -1: none
  bool authenticated = false;  ///< `node` is the link's authenticated peer
  std::string reason;      ///< a short name: a frame_error or auth_error, "unknown_address", "too_many_pending", ...
  std::string what;        ///< a sentence for the log
};

/// Called on the transport's io thread. They must not block (hand work to
/// other threads) and must not call stop(); they may call send().
struct transport_handlers {
  /// A message from `node` for `destination`, its segments read in place from
  /// a pooled buffer (which returns to the pool when the last copy of `m` goes).
  std::function<void(uint32_t node, const address& destination, message m)> on_message;
  /// A session with `node` began (its link authenticated).
  std::function<void(uint32_t node)> on_peer_up;
  /// The session with `node` ended: dead (silent for peer_timeout), stopped
  /// (`goodbye`: it said so) or restarted; `why` says which, for the log.
  std::function<void(uint32_t node, const std::string& why, bool goodbye)> on_peer_down;
  /// A refused connection, a failed handshake or a bad frame (counted in
  /// transport_stats); called for every one: rate-limit the log (rejection_log).
  std::function<void(const rejection& r)> on_rejected;
};

struct transport_stats {
  uint64_t frames_sent = 0, bytes_sent = 0;          ///< message frames (re-sends included) and all bytes written
  uint64_t frames_received = 0, bytes_received = 0;  ///< message frames delivered and all bytes read
  uint64_t heartbeats_sent = 0, heartbeats_received = 0;
  uint64_t resent = 0;              ///< message frames written again after a reconnect
  uint64_t duplicates_dropped = 0;  ///< received again (by sequence number), not delivered twice
  uint64_t lost = 0;                ///< gaps in the sequence numbers received (dropped by fault injection)
  uint64_t send_refused = 0;        ///< send() calls refused: over max_queue_bytes, or the transport stopped
  uint64_t dropped_at_down = 0;     ///< message frames queued or unacknowledged when a session ended
  uint64_t faults_dropped = 0, faults_delayed = 0, faults_duplicated = 0, faults_disconnected = 0;
  uint64_t links_up = 0;            ///< links authenticated (first and reconnections)
  uint64_t handler_errors = 0;      ///< on_message threw
  std::array<uint64_t, frame_errors> rejected_frames{};    ///< by frame_error
  std::array<uint64_t, auth_errors> rejected_handshakes{};  ///< by auth_error
  uint64_t refused_connections = 0;  ///< closed at accept: an address outside the node list, or no slot left
  uint32_t peers_up = 0;            ///< sessions alive now
  uint64_t lane_frames_sent = 0, lane_bytes_sent = 0;          ///< messages sent through same-host lanes, their bytes
  uint64_t lane_frames_received = 0, lane_bytes_received = 0;  ///< messages received through lanes, their bytes
  uint64_t lanes_up = 0;            ///< lanes this node offered that the peer mapped
  uint64_t lane_full = 0;           ///< large messages sent through the socket because the lane had no room

  uint64_t rejected() const;  ///< frames and handshakes rejected, all reasons
};

class transport {
public:
  /// Checks the options (throws error: no secret, self out of range, ...).
  transport(transport_options o, transport_handlers h);
  ~transport();  ///< stop()s
  transport(const transport&) = delete;
  transport& operator=(const transport&) = delete;

  /// Binds nodes[self]'s port (throws error when it cannot), dials the nodes
  /// of smaller index and starts the io thread.
  void start();
  /// Queues `m` for `destination` on `node` and returns at once (thread-safe);
  /// the segments are gather-written, never copied. A frame goes ahead of the
  /// queued frames of a higher `priority` value (not yet written; equal
  /// priorities keep their order): a data-parallel worker's first layers'
  /// gradients overtake the others. A frame being written is not interrupted
  /// (messages are not sliced). False when refused (over max_queue_bytes, or
  /// stopped). Throws error for `self` or an unknown node.
  bool send(uint32_t node, const address& destination, const message& m, int priority = 0);
  /// Says goodbye to the peers, closes every link and joins the io thread. No
  /// callback runs after it returns. Idempotent.
  void stop();

  transport_stats stats() const;
  /// The port this transport listens on (after start()).
  uint16_t local_port() const;
  /// Whether a session with `node` is alive.
  bool peer_up(uint32_t node) const;

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace troupe::net
