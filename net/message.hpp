#pragma once

// Messages between actors: immutable, ref-counted Cap'n Proto buffers. Built
// once; every receiver reads the same segments in place (no re-serialization,
// tensor payloads are not copied). Readers enforce limits and validate before
// an actor touches the contents.

#include <capnp/message.h>
#include <capnp/orphan.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "net/address.hpp"
#include "net/messages.capnp.h"
#include "tensor/tensor.hpp"

namespace troupe::net {

/// Why a message was rejected.
enum class reject_reason : uint8_t {
  malformed,        ///< not a valid Cap'n Proto message (truncated, bad pointers, cycles)
  too_large,        ///< over the reader's size or traversal limit
  unknown_version,  ///< schemaVersion this build does not know
  unknown_kind,     ///< a union member this build does not know
  bad_tensor,       ///< unknown dtype, or payload size that does not match the shape
  non_finite,       ///< NaN or Inf in a tensor payload
  wrong_shape,      ///< tensors that do not match what the receiver expects
};
constexpr int reject_reasons = 7;
const char* to_string(reject_reason r);

/// A rejected message: the reason (to count) and a message for the log.
class message_error : public bad_message_error {
public:
  message_error(reject_reason r, const std::string& what) : bad_message_error(what), reason_(r) {}
  reject_reason reason() const { return reason_; }

private:
  reject_reason reason_;
};

/// An immutable message shared by reference.
class message {
public:
  message() = default;
  /// Takes a finished builder; its segments become the message. `keep` (an
  /// external_payload's buffer) lives as long as the message.
  static message from_builder(std::unique_ptr<capnp::MallocMessageBuilder> b, std::shared_ptr<const void> keep = nullptr);
  /// Bytes from outside (the network, a file): copied once into word-aligned memory.
  static message from_bytes(const void* data, std::size_t bytes);
  /// Segments read in place where they lie, one after another from `words`
  /// (8-byte aligned): `sizes[i]` words each. `owner` keeps that memory alive
  /// and is let go (a pooled buffer goes back to its pool) with the message's
  /// last holder. The caller has checked the sizes against the buffer.
  static message from_segments(std::shared_ptr<const void> owner, const capnp::word* words,
                               kj::ArrayPtr<const uint32_t> sizes);

  bool empty() const { return !state_; }
  /// Total size of the segments in bytes.
  std::size_t bytes() const;
  kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments() const;
  /// True for from_bytes(): one buffer in Cap'n Proto's stream framing.
  bool framed() const;
  /// The builder of a message built in process, to change it in place (copy on
  /// write): only while this handle is the message's one reference, so that
  /// nobody else can see the change; nullptr otherwise, and for bytes from
  /// outside. Set fields that exist or overwrite payloads; never allocate (the
  /// segments stay those from_builder() took).
  capnp::MallocMessageBuilder* exclusive_builder();

private:
  struct state;
  std::shared_ptr<state> state_;
};

/// A builder whose first segment holds `payload_bytes` and the message around
/// them, so that a message is one segment (a gather-write of one buffer). From
/// pooled_payload_bytes on, that segment comes from a process-wide pool (zero,
/// and zeroed again by the builder when it goes: a payload its producer
/// writes whole is cheaper outside it, see written_blob).
std::unique_ptr<capnp::MallocMessageBuilder> make_builder(std::size_t payload_bytes = 0);
constexpr std::size_t pooled_payload_bytes = std::size_t(64) << 10;

/// A blob outside a builder's segments (Cap'n Proto's referenceExternalData:
/// a segment of its own, written to the wire as it is): a buffer of a pool
/// whose buffers are not zeroed, so that a large payload is written once,
/// by its producer, instead of zeroed by the builder, copied in, and zeroed
/// again when the builder goes. `data` has `bytes` for the caller to fill
/// (the padding to whole words is zero); adopt `orphan` into the message,
/// then pass `buffer` to message::from_builder, which keeps it.
struct external_blob {
  std::shared_ptr<const void> buffer;
  capnp::Orphan<capnp::Data> orphan;
  std::byte* data = nullptr;
};
external_blob external_payload(capnp::MessageBuilder& b, std::size_t bytes);

/// Of a written_blob of `bytes`, what lies inside the builder (for make_builder's size).
constexpr std::size_t written_inline_bytes(std::size_t bytes) { return bytes < pooled_payload_bytes ? bytes : 0; }

/// Where a producer writes a blob of `bytes` that it fills whole: from
/// pooled_payload_bytes on, while `keep` is empty (one such blob per
/// message), an external_payload adopted by `adopt` and kept in `keep` (pass
/// it to message::from_builder); otherwise `init(bytes)`, inside the builder.
/// The bytes are not zeroed: the caller writes every one of them.
template <typename Init, typename Adopt>
std::byte* written_blob(capnp::MessageBuilder& msg, std::size_t bytes, std::shared_ptr<const void>& keep, Init init,
                        Adopt adopt) {
  if (written_inline_bytes(bytes) == bytes || keep) return reinterpret_cast<std::byte*>(init(bytes).begin());
  external_blob e = external_payload(msg, bytes);
  adopt(kj::mv(e.orphan));
  keep = std::move(e.buffer);
  return e.data;
}

/// Starts a message in `b`: schema version, source and destination. Set one
/// member of the union on the result.
wire::Envelope::Builder init_envelope(capnp::MallocMessageBuilder& b, const address& source,
                                      const address& destination);

struct reader_limits {
  uint64_t max_bytes = uint64_t(512) << 20;  ///< larger messages are rejected unread
  int nesting_limit = 16;
  bool check_finite = true;                  ///< scan tensor payloads for NaN/Inf
  /// The scan, the receiver's: true when data[0, n) is all finite; called with
  /// scan_context. Null: a plain loop on the reading thread.
  bool (*finite_scan)(const void* scan_context, const float* data, int64_t n) = nullptr;
  const void* scan_context = nullptr;
};

/// Limits for messages of troupe's own peers: parameters and batches can be large.
reader_limits peer_limits();

/// Opens `m` and validates all of it: size and traversal limits, schema
/// version, message kind, every tensor's dtype and payload size, finite values.
/// Throws message_error.
class envelope_reader {
public:
  explicit envelope_reader(const message& m, const reader_limits& limits = {});
  ~envelope_reader();
  wire::Envelope::Reader root() const { return root_; }

private:
  message m_;
  std::unique_ptr<capnp::MessageReader> reader_;
  wire::Envelope::Reader root_;
};

/// A message opened and validated once, shared by whoever keeps it (a stage
/// keeps its inputs until their backward): the message lives as long as it.
using opened_message = std::shared_ptr<const envelope_reader>;

/// How many times this process has opened a message (an envelope_reader or
/// read_header): tests count that a receiver opens each message once.
uint64_t messages_opened();

/// The routing header of a message: its kind and addresses.
struct header {
  wire::Envelope::Which kind;
  address source, destination;
};
/// Reads the header of `m` without validating its payloads (the receiver
/// validates them); throws message_error for a message whose header cannot be read.
header read_header(const message& m);

address read_address(wire::Address::Reader r);
void write_address(wire::Address::Builder b, const address& a);

/// A tensor payload read in place: valid while its message lives.
struct tensor_view {
  shape dims;
  const float* data = nullptr;
  int64_t numel() const { return dims.numel(); }
};

/// Views `r` without copying; throws message_error (bad_tensor) when the
/// payload does not match the shape.
tensor_view view(wire::Tensor::Reader r, const std::string& what);

/// A range of a declared parameter layout read in place (wire::FlatTensors):
/// valid while its message lives.
struct flat_view {
  uint32_t first = 0;         ///< index of its first tensor in the layout
  int64_t offset = 0;         ///< element offset of the range in the flat buffer
  std::vector<shape> shapes;  ///< of its tensors
  const float* data = nullptr;
  int64_t numel = 0;
};

/// Views `r`; throws message_error (bad_tensor) when the payload size does not
/// match the shapes.
flat_view view(wire::FlatTensors::Reader r, const std::string& what);

/// Throws message_error (wrong_shape) unless `v` is exactly the range
/// (first, offset, shapes) the receiver expects.
void require_range(const flat_view& v, uint32_t first, int64_t offset, const std::vector<shape>& shapes,
                   const std::string& what);

/// Initializes `b` as the range (first, offset, shapes) of a layout; returns
/// its one payload (zeroed), to be written in place.
float* init_flat(wire::FlatTensors::Builder b, uint32_t first, int64_t offset, const std::vector<shape>& shapes);
/// The same for a payload the caller writes whole (not zeroed): a large one
/// is `msg`'s external blob, kept in `keep` (written_blob).
float* init_flat(capnp::MessageBuilder& msg, wire::FlatTensors::Builder b, uint32_t first, int64_t offset,
                 const std::vector<shape>& shapes, std::shared_ptr<const void>& keep);
/// The payload of a range being built or edited in place (inside the builder or an external blob).
float* payload(wire::FlatTensors::Builder b);

/// Counts rejected messages by reason (thread-safe).
class reject_counter {
public:
  void count(reject_reason r) { counts_[static_cast<int>(r)].fetch_add(1, std::memory_order_relaxed); }
  uint64_t get(reject_reason r) const { return counts_[static_cast<int>(r)].load(std::memory_order_relaxed); }
  uint64_t total() const;

private:
  std::array<std::atomic<uint64_t>, reject_reasons> counts_{};
};

} // namespace troupe::net
