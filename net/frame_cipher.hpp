#pragma once

// Protection of the frames of an authenticated link (docs/protocol.md,
// "Between nodes: frame protection"): every frame after the handshake carries a
// 16-byte tag (ChaCha20-Poly1305; AES-256-GCM when encrypted) over its header,
// its segment table and its payload, under a key of that link and direction (derived from the handshake: net/auth.hpp),
// with the frame's number on the link as the nonce. A frame that was altered,
// forged, replayed or reordered fails its tag and closes the link. With
// `confidential` the payload (the segments) is also encrypted; the header and
// the table are always readable (the reader needs the lengths) and always
// authenticated.

#include <array>
#include <cstddef>
#include <cstdint>

struct evp_cipher_ctx_st;

namespace troupe::net {

constexpr std::size_t frame_tag_bytes = 16;
constexpr std::size_t frame_key_bytes = 32;
using frame_key = std::array<uint8_t, frame_key_bytes>;
using frame_tag = std::array<std::byte, frame_tag_bytes>;

/// The keys of one link, from one side: what it seals with and what it opens with.
struct link_keys {
  frame_key send{}, receive{};
};

/// One direction of a link: seals the frames a side writes, or opens the
/// frames it reads. Frames are numbered from 0 in the order they are sealed
/// (opened); both sides count alike. Not thread-safe.
class frame_cipher {
public:
  enum class direction { seal, open };
  /// ChaCha20-Poly1305, or AES-256-GCM when `confidential` (the faster of the two for each
  /// use on AVX-512 IFMA machines). Throws error when OpenSSL cannot set it up.
  frame_cipher(const frame_key& key, direction d, bool confidential);
  ~frame_cipher();
  frame_cipher(const frame_cipher&) = delete;
  frame_cipher& operator=(const frame_cipher&) = delete;

  /// Starts the next frame.
  void begin();
  /// Authenticated, never encrypted: the header and the segment table. All of
  /// it comes before the frame's first payload() call.
  void authenticate(const void* data, std::size_t bytes);
  /// The payload, in order: authenticated, and when confidential encrypted
  /// (seal) or decrypted (open) from `in` into `out` (which may be `in`).
  void payload(const std::byte* in, std::byte* out, std::size_t bytes);
  /// Seal: the frame's tag.
  frame_tag finish();
  /// Open: whether the frame's tag is `tag` (false: altered, forged, replayed or out of order).
  bool verify(const frame_tag& tag);

  bool confidential() const { return confidential_; }
  /// Frames begun so far.
  uint64_t frames() const { return counter_; }

private:
  evp_cipher_ctx_st* ctx_;
  direction dir_;
  bool confidential_;
  bool in_payload_ = false;
  uint64_t counter_ = 0;
};

} // namespace troupe::net
