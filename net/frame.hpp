#pragma once

// Frames: what a link between two nodes carries (docs/protocol.md, "Between nodes: frames").
// A frame is a fixed 56-byte header, then for a message frame a table of its
// Cap'n Proto segments' sizes and the segments as they are (gather-written,
// never flattened), for a handshake frame a small body. The reader validates
// every header field before it trusts a length, reads segments into reused
// 8-byte-aligned buffers and hands them out as net::message values read in place.

#include <capnp/common.h>
#include <kj/array.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "net/address.hpp"
#include "net/buffer_pool.hpp"
#include "net/frame_cipher.hpp"
#include "net/message.hpp"
#include "tensor/error.hpp"

namespace troupe::net {

enum class frame_kind : uint8_t {
  message = 1,    ///< an envelope: destination, sequence number, segments
  heartbeat = 2,  ///< liveness, and the acknowledgement of the peer's messages; no body
  goodbye = 3,    ///< the sender stops on purpose; no body
  message_ref = 4,  ///< an envelope whose segments lie in the sender's same-host lane (net/shm_lane.hpp)
  lane_offer = 5,   ///< the sender offers its same-host lane: region id, size, name
  lane_accept = 6,  ///< the receiver mapped the offered lane: its id
  hello = 16,     ///< handshake, dialer -> acceptor (net/auth.hpp)
  challenge = 17, ///< handshake, acceptor -> dialer
  proof = 18,     ///< handshake, dialer -> acceptor
  refuse = 19,    ///< the handshake failed; the body says why (text)
};
const char* to_string(frame_kind k);
/// A set of frame kinds, for frame_reader::allow().
constexpr uint32_t kind_bit(frame_kind k) { return uint32_t(1) << static_cast<uint8_t>(k); }
/// The kinds that carry a message: numbered, acknowledged, sent again after a reconnect.
constexpr bool carries_message(frame_kind k) { return k == frame_kind::message || k == frame_kind::message_ref; }
/// A message_ref frame's body after its segment table: the lane's id, the payload's offset and size.
constexpr std::size_t message_ref_bytes = 24;
struct message_ref {
  uint64_t lane = 0, offset = 0, bytes = 0;
};

constexpr uint32_t frame_magic = 0x31505254;  // "TRP1" in the stream (little-endian)
constexpr uint8_t frame_version = 1;
constexpr std::size_t frame_header_bytes = 56;
constexpr uint32_t max_frame_segments = 512;
constexpr uint32_t max_control_body = 1024;  ///< bodies of handshake and refuse frames

struct frame_header {
  frame_kind kind = frame_kind::heartbeat;
  uint32_t segments = 0;    ///< message frames: Cap'n Proto segments, 1..max_frame_segments
  uint64_t sequence = 0;    ///< message frames: number in the link's session, from 1
  uint64_t ack = 0;         ///< last sequence number of the peer's messages delivered here
  uint64_t body_bytes = 0;  ///< bytes after the fixed header
  address destination;      ///< message frames: the recipient of this copy of the envelope
};

/// Why a frame was rejected.
enum class frame_error : uint8_t {
  bad_magic,        ///< not a troupe frame (or the stream lost its place)
  bad_version,      ///< another frame format version
  bad_kind,         ///< a kind this build does not know
  bad_reserved,     ///< flags or reserved fields not zero, or fields a kind does not use set
  bad_segments,     ///< segment count out of range, or an empty segment
  bad_length,       ///< body size that does not match the segment table or the kind
  too_large,        ///< over the maximum frame size
  unexpected_kind,  ///< a kind not allowed now (a message before authentication, a hello after it)
  bad_envelope,     ///< the segments are not a readable envelope (net::read_header)
  bad_tag,          ///< a protected frame whose tag does not verify: altered, forged, replayed or reordered
  wrong_source,     ///< a message whose envelope names another source node than the link's authenticated peer
  frame_timeout,    ///< a frame that did not arrive whole in time (a stalled or trickling peer)
  bad_lane,         ///< a message_ref naming no lane of the peer's, or a slot it did not publish
};
constexpr int frame_errors = 13;
const char* to_string(frame_error e);

/// A rejected frame. After a fatal one the stream cannot be trusted (the
/// reader does not know where the next frame starts): close it.
class frame_exception : public error {
public:
  frame_exception(frame_error r, bool fatal, const std::string& what) : error(what), reason_(r), fatal_(fatal) {}
  frame_error reason() const { return reason_; }
  bool fatal() const { return fatal_; }

private:
  frame_error reason_;
  bool fatal_;
};

/// Writes the fixed header (frame_header_bytes) to `out`.
void encode_header(const frame_header& h, std::byte* out);
/// Decodes and validates the fixed header at `in`; throws frame_exception (fatal).
frame_header decode_header(const std::byte* in, uint64_t max_frame_bytes);
/// Bytes of the segment table of a message frame (4 per segment, padded to 8).
std::size_t segment_table_bytes(uint32_t segments);
/// Checks the segment table (`h.segments` sizes in words) against the header;
/// throws frame_exception (fatal).
void check_segment_table(const frame_header& h, const uint32_t* sizes);

/// The segments of `m` as a frame carries them: a message from
/// message::from_bytes() holds the stream framing, which is parsed off.
/// Throws message_error for a malformed framing.
std::vector<kj::ArrayPtr<const capnp::word>> wire_segments(const message& m);

/// An outgoing frame: the fixed header and the segment table (or a control
/// body) in `head`, then the message's segments, written as they are; on a
/// protected link (seal()) the segments encrypted when confidential, then the tag.
struct out_frame {
  std::vector<std::byte> head;
  message msg;  ///< keeps the segments alive
  std::vector<kj::ArrayPtr<const capnp::word>> segments;
  uint64_t sequence = 0;
  frame_kind kind = frame_kind::heartbeat;
  bool sealed = false;             ///< seal() ran: the tag (and `cipher`) follow
  frame_tag tag{};                 ///< sealed: written after the payload
  std::shared_ptr<pooled_buffer> cipher;  ///< sealed by a confidential cipher: the segments encrypted
  std::size_t cipher_bytes = 0;

  /// Sets the acknowledgement field in the header (before seal()).
  void set_ack(uint64_t ack);
  /// Sets the sequence number (message frames; before seal()).
  void set_sequence(uint64_t sequence);
  /// Protects the frame as it is now with the next frame number of `c`; a
  /// confidential cipher encrypts the segments into a buffer of `pool` (null: a fresh one).
  void seal(frame_cipher& c, const std::shared_ptr<buffer_pool>& pool = nullptr);
  /// Size on the wire.
  std::size_t bytes() const;
  /// Size of the header, table and segments (what a queue accounts; no tag).
  std::size_t plain_bytes() const;
  /// Calls f(const std::byte* data, std::size_t bytes) for each piece the wire carries, in order.
  template <typename F>
  void for_each_piece(F&& f) const {
    f(head.data(), head.size());
    if (sealed && cipher) {
      f(cipher->data(), cipher_bytes);
    } else {
      for (auto& s : segments) f(reinterpret_cast<const std::byte*>(s.begin()), s.size() * sizeof(capnp::word));
    }
    if (sealed) f(tag.data(), tag.size());
  }
};

/// A message frame for `destination` carrying `m`.
out_frame make_message_frame(const address& destination, const message& m, uint64_t sequence);
/// The message_ref frame of `message_frame` (a make_message_frame()): its
/// header and segment table, the segments lying in lane `r.lane` at
/// `r.offset`, `r.bytes` long.
out_frame make_message_ref_frame(const out_frame& message_frame, const message_ref& r);
/// The reference a message_ref frame's body holds (in_frame::body).
message_ref decode_message_ref(const std::vector<std::byte>& body);
/// A frame without segments: heartbeat and goodbye (no body), handshake and
/// refuse (a body of at most max_control_body bytes).
out_frame make_control_frame(frame_kind kind, const void* body = nullptr, std::size_t bytes = 0, uint64_t ack = 0);

/// A frame read from a stream.
struct in_frame {
  frame_header header;
  message msg;                  ///< message frames: the envelope, read in place
  address source;               ///< message frames, when the reader checks envelopes: the envelope's source
  std::vector<std::byte> body;  ///< handshake, refuse and lane frames; a message_ref's reference
  std::vector<uint32_t> sizes;  ///< message_ref frames: the segments' sizes in words
};

/// A message frame's body is first given at most this much buffer; more as
/// its bytes arrive (x4 each time), or at once up to the largest frame the
/// link has completed.
constexpr std::size_t initial_frame_grant = std::size_t(4) << 20;

/// Reads frames from a byte stream: the caller reads into next_buffer(),
/// commits what it read, and takes frames with next(). Headers and small
/// frames go through a staging buffer; a large body is read straight into its
/// pooled buffer. Each message frame's segments get a buffer from the pool.
class frame_reader {
public:
  frame_reader(uint64_t max_frame_bytes, std::shared_ptr<buffer_pool> pool, std::size_t staging_bytes = 64 << 10);

  /// The kinds accepted from now on (a set of kind_bit()); any other is
  /// rejected (unexpected_kind, fatal) from its fixed header, body unread.
  void allow(uint32_t kinds) { allowed_ = kinds; }
  /// Check that a message frame's segments are an envelope whose header reads
  /// (net::read_header); a failure is bad_envelope, not fatal. On by default.
  void check_envelopes(bool on) { check_envelopes_ = on; }
  /// From the next frame on, every frame carries a tag that `opener` must
  /// verify (and its payload is decrypted when the cipher is confidential);
  /// a frame that fails is bad_tag (fatal) and nothing of it is handed out.
  void protect(std::unique_ptr<frame_cipher> opener) { opener_ = std::move(opener); }
  /// Bytes of receive buffer held for the frame in progress.
  std::size_t held_bytes() const { return body_ ? body_->capacity() : 0; }
  /// Bytes of the frame in progress (header included; 0 between frames).
  uint64_t frame_bytes() const { return state_ == state::header ? 0 : frame_header_bytes + header_.body_bytes; }

  /// Where the next bytes of the stream go, and at most how many.
  kj::ArrayPtr<std::byte> next_buffer();
  /// `n` bytes were written at the start of next_buffer().
  void commit(std::size_t n);
  /// The next complete frame into `out`: false when more bytes are needed.
  /// Throws frame_exception; after a fatal one the reader must not be used.
  bool next(in_frame& out);

  /// Whether bytes of a frame not yet complete are buffered.
  bool mid_frame() const { return state_ != state::header || end_ != begin_; }

private:
  enum class state { header, table, body, control, tag };
  enum class step { more, again, frame };  // needs bytes, goes on to the next state, handed a frame out
  std::size_t available() const { return end_ - begin_; }
  step take_header(in_frame& out);
  step take_table();
  step take_body(in_frame& out);
  step take_control(in_frame& out);
  step take_tag(in_frame& out);
  step complete(in_frame& out);
  bool finish_message(in_frame& out);
  bool deliver(in_frame& out);
  void body_arrived(std::size_t n);
  void make_room();

  uint64_t max_frame_;
  std::shared_ptr<buffer_pool> pool_;
  std::unique_ptr<uint64_t[]> staging_;  // 8-byte aligned
  std::size_t capacity_, begin_ = 0, end_ = 0;
  uint32_t allowed_ = ~uint32_t(0);
  bool check_envelopes_ = true;

  state state_ = state::header;
  bool direct_ = false;  // next_buffer() handed out the body buffer
  frame_header header_;
  std::vector<uint32_t> sizes_;
  std::shared_ptr<pooled_buffer> body_;
  std::size_t body_needed_ = 0, body_filled_ = 0, body_room_ = 0;
  std::size_t earned_ = initial_frame_grant;  // the largest message body completed on this stream
  std::unique_ptr<frame_cipher> opener_;
  std::vector<std::byte> control_body_;       // a control frame's body, read before its tag
  bool poisoned_ = false;
};

} // namespace troupe::net
