#include "net/message.hpp"

#include "net/buffer_pool.hpp"
#include "net/protocol.hpp"

#include "net/tensor_codec.hpp"

#include <capnp/serialize.h>
#include <kj/exception.h>

#include <atomic>
#include <cmath>
#include <cstring>

namespace troupe::net {

const char* to_string(reject_reason r) {
  switch (r) {
    case reject_reason::malformed: return "malformed";
    case reject_reason::too_large: return "too_large";
    case reject_reason::unknown_version: return "unknown_version";
    case reject_reason::unknown_kind: return "unknown_kind";
    case reject_reason::bad_tensor: return "bad_tensor";
    case reject_reason::non_finite: return "non_finite";
    case reject_reason::wrong_shape: return "wrong_shape";
  }
  return "unknown";
}

struct message::state {
  std::shared_ptr<const void> external;                  // a builder's external segment (outlives the builder)
  std::unique_ptr<capnp::MallocMessageBuilder> builder;  // built in process, or
  kj::Array<capnp::word> words;                          // bytes from outside, or
  std::shared_ptr<const void> owner;                     // memory someone else owns (a pooled receive buffer)
  kj::Array<kj::ArrayPtr<const capnp::word>> segs;
  bool framed = false;  // words carry the stream framing (segment table first)
};

message message::from_builder(std::unique_ptr<capnp::MallocMessageBuilder> b, std::shared_ptr<const void> keep) {
  auto s = std::make_shared<state>();
  s->external = std::move(keep);
  auto out = b->getSegmentsForOutput();
  s->segs = kj::heapArray<kj::ArrayPtr<const capnp::word>>(out.size());
  for (std::size_t i = 0; i < out.size(); ++i) s->segs[i] = out[i];
  s->builder = std::move(b);
  message m;
  m.state_ = std::move(s);
  return m;
}

message message::from_bytes(const void* data, std::size_t bytes) {
  auto s = std::make_shared<state>();
  s->words = kj::heapArray<capnp::word>((bytes + 7) / 8);
  std::memset(s->words.begin(), 0, s->words.size() * 8);
  if (bytes) std::memcpy(s->words.begin(), data, bytes);
  s->segs = kj::heapArray<kj::ArrayPtr<const capnp::word>>(1);
  s->segs[0] = s->words.asPtr();
  s->framed = true;
  message m;
  m.state_ = std::move(s);
  return m;
}

message message::from_segments(std::shared_ptr<const void> owner, const capnp::word* words,
                               kj::ArrayPtr<const uint32_t> sizes) {
  auto s = std::make_shared<state>();
  s->segs = kj::heapArray<kj::ArrayPtr<const capnp::word>>(sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    s->segs[i] = kj::arrayPtr(words, sizes[i]);
    words += sizes[i];
  }
  s->owner = std::move(owner);
  message m;
  m.state_ = std::move(s);
  return m;
}

std::size_t message::bytes() const {
  std::size_t n = 0;
  if (state_)
    for (auto& s : state_->segs) n += s.size() * sizeof(capnp::word);
  return n;
}

bool message::framed() const { return state_ && state_->framed; }

namespace {

struct pooled_segment {
  std::shared_ptr<pooled_buffer> buffer;
};

/// A builder whose first segment is a buffer of the send pool, handed back
/// (zero again: the builder's destructor zeroes what it used) with the message.
class pooled_builder : private pooled_segment, public capnp::MallocMessageBuilder {
public:
  pooled_builder(std::shared_ptr<pooled_buffer> b, std::size_t words)
      : pooled_segment{std::move(b)},
        capnp::MallocMessageBuilder(kj::arrayPtr(reinterpret_cast<capnp::word*>(buffer->data()), words)) {}
};

/// First segments of large messages: reused instead of fresh from malloc,
/// whose large blocks come and go as mapped pages (a page fault per 4 KiB).
const std::shared_ptr<buffer_pool>& send_pool() {
  static const std::shared_ptr<buffer_pool> pool = buffer_pool::create(std::size_t(64) << 20, true);
  return pool;
}

} // namespace

std::unique_ptr<capnp::MallocMessageBuilder> make_builder(std::size_t payload_bytes) {
  // Headers: a few words per tensor (its pointer, shape and struct); 64 per 8 KiB is ample.
  const std::size_t words = std::min<std::size_t>(payload_bytes / 8 + payload_bytes / 1024 + 1024, 1u << 28);
  if (payload_bytes >= pooled_payload_bytes)
    return std::make_unique<pooled_builder>(send_pool()->acquire(words * sizeof(capnp::word)), words);
  return std::make_unique<capnp::MallocMessageBuilder>(static_cast<unsigned>(words));
}

external_blob external_payload(capnp::MessageBuilder& b, std::size_t bytes) {
  // Large payloads come and go at the rate of the links: reused, not zeroed (every byte is written).
  static const std::shared_ptr<buffer_pool> pool = buffer_pool::create(std::size_t(64) << 20, false);
  const std::size_t padded = (bytes + 7) / 8 * 8;
  std::shared_ptr<pooled_buffer> buf = pool->acquire(std::max<std::size_t>(padded, 8));
  std::memset(buf->data() + bytes, 0, padded - bytes);
  external_blob e;
  e.data = buf->data();
  e.orphan = b.getOrphanage().referenceExternalData(
      capnp::Data::Reader(reinterpret_cast<const kj::byte*>(buf->data()), bytes));
  e.buffer = std::move(buf);
  return e;
}

wire::Envelope::Builder init_envelope(capnp::MallocMessageBuilder& b, const address& source,
                                      const address& destination) {
  auto env = b.initRoot<wire::Envelope>();
  env.setSchemaVersion(wire::SCHEMA_VERSION);
  write_address(env.initSource(), source);
  write_address(env.initDestination(), destination);
  return env;
}

reader_limits peer_limits() {
  reader_limits l;
  l.max_bytes = uint64_t(1) << 30;
  return l;
}

address read_address(wire::Address::Reader r) {
  const auto role_value = static_cast<uint16_t>(r.getRole());
  if (role_value >= static_cast<uint16_t>(roles))
    throw message_error(reject_reason::malformed, "unknown role " + std::to_string(role_value) + " in an address");
  return {r.getNode(), static_cast<role>(role_value), r.getIndex()};
}

void write_address(wire::Address::Builder b, const address& a) {
  b.setNode(a.node);
  b.setRole(static_cast<wire::Role>(a.role));
  b.setIndex(a.index);
}

capnp::MallocMessageBuilder* message::exclusive_builder() {
  if (!state_ || !state_->builder || state_.use_count() != 1) return nullptr;
  // The holder that let go last did so with an acquire-release decrement that
  // this fence pairs with: its reads happen before the writes that follow.
  std::atomic_thread_fence(std::memory_order_acquire);
  return state_->builder.get();
}

kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> message::segments() const {
  if (!state_) return nullptr;
  return state_->segs.asPtr();
}

uint64_t reject_counter::total() const {
  uint64_t t = 0;
  for (auto& c : counts_) t += c.load(std::memory_order_relaxed);
  return t;
}

tensor_view view(wire::Tensor::Reader r, const std::string& what) {
  if (r.getDtype() != wire::DType::F32)
    throw message_error(reject_reason::bad_tensor, what + ": unknown dtype " + std::to_string(int(r.getDtype())));
  std::vector<int64_t> dims;
  int64_t numel = 1;
  for (int64_t d : r.getShape()) {
    if (d < 0 || (d > 0 && numel > (int64_t(1) << 40) / d))
      throw message_error(reject_reason::bad_tensor, what + ": invalid dimension " + std::to_string(d));
    dims.push_back(d);
    numel *= d;
  }
  auto data = r.getData();
  if (data.size() != static_cast<std::size_t>(numel) * sizeof(float))
    throw message_error(reject_reason::bad_tensor, what + ": payload of " + std::to_string(data.size()) +
                                                       " bytes does not match shape " + shape(dims).to_string() +
                                                       " (" + std::to_string(numel * sizeof(float)) + " bytes)");
  return {shape(dims), reinterpret_cast<const float*>(data.begin())};
}

flat_view view(wire::FlatTensors::Reader r, const std::string& what) {
  flat_view v;
  v.first = r.getFirst();
  const uint64_t offset = r.getOffset();
  if (offset > (uint64_t(1) << 40)) throw message_error(reject_reason::bad_tensor, what + ": invalid offset");
  v.offset = static_cast<int64_t>(offset);
  int64_t numel = 0;
  for (auto s : r.getShapes()) {
    std::vector<int64_t> dims;
    int64_t n = 1;
    for (int64_t d : s.getDims()) {
      if (d < 0 || (d > 0 && n > (int64_t(1) << 40) / d))
        throw message_error(reject_reason::bad_tensor, what + ": invalid dimension " + std::to_string(d));
      dims.push_back(d);
      n *= d;
    }
    numel += n;
    if (numel > (int64_t(1) << 40)) throw message_error(reject_reason::bad_tensor, what + ": too many elements");
    v.shapes.emplace_back(std::move(dims));
  }
  auto data = r.getPayload();
  if (data.size() != static_cast<std::size_t>(numel) * sizeof(float))
    throw message_error(reject_reason::bad_tensor, what + ": payload of " + std::to_string(data.size()) +
                                                       " bytes does not match its " + std::to_string(v.shapes.size()) +
                                                       " shapes (" + std::to_string(numel * sizeof(float)) + " bytes)");
  v.data = reinterpret_cast<const float*>(data.begin());
  v.numel = numel;
  return v;
}

void require_range(const flat_view& v, uint32_t first, int64_t offset, const std::vector<shape>& shapes,
                   const std::string& what) {
  auto range = [](uint32_t f, std::size_t n, int64_t o) {
    return "tensors [" + std::to_string(f) + ", " + std::to_string(f + n) + ") at offset " + std::to_string(o);
  };
  if (v.first != first || v.offset != offset || v.shapes.size() != shapes.size())
    throw message_error(reject_reason::wrong_shape, what + ": " + range(v.first, v.shapes.size(), v.offset) +
                                                        ", expected " + range(first, shapes.size(), offset));
  for (std::size_t i = 0; i < shapes.size(); ++i)
    if (v.shapes[i] != shapes[i])
      throw message_error(reject_reason::wrong_shape, what + ": tensor " + std::to_string(first + i) + " has shape " +
                                                          v.shapes[i].to_string() + ", expected " +
                                                          shapes[i].to_string());
}

namespace {

/// Writes the range's header into `b`; returns its payload's bytes.
uint64_t init_range(wire::FlatTensors::Builder b, uint32_t first, int64_t offset, const std::vector<shape>& shapes) {
  b.setFirst(first);
  b.setOffset(static_cast<uint64_t>(offset));
  auto list = b.initShapes(static_cast<unsigned>(shapes.size()));
  int64_t numel = 0;
  for (unsigned i = 0; i < list.size(); ++i) {
    auto dims = list[i].initDims(static_cast<unsigned>(shapes[i].rank()));
    for (unsigned j = 0; j < dims.size(); ++j) dims.set(j, shapes[i][j]);
    numel += shapes[i].numel();
  }
  const uint64_t bytes = static_cast<uint64_t>(numel) * sizeof(float);
  if (bytes >= (uint64_t(1) << 29))
    throw error("init_flat: " + std::to_string(bytes) + " bytes of parameters in one range; one Cap'n Proto blob "
                "holds fewer than 2^29 bytes (use more shards)");
  return bytes;
}

} // namespace

float* init_flat(wire::FlatTensors::Builder b, uint32_t first, int64_t offset, const std::vector<shape>& shapes) {
  const uint64_t bytes = init_range(b, first, offset, shapes);
  return reinterpret_cast<float*>(b.initPayload(static_cast<unsigned>(bytes)).begin());
}

float* init_flat(capnp::MessageBuilder& msg, wire::FlatTensors::Builder b, uint32_t first, int64_t offset,
                 const std::vector<shape>& shapes, std::shared_ptr<const void>& keep) {
  const auto bytes = static_cast<std::size_t>(init_range(b, first, offset, shapes));
  return reinterpret_cast<float*>(written_blob(
      msg, bytes, keep, [&](std::size_t n) { return b.initPayload(static_cast<unsigned>(n)); },
      [&](capnp::Orphan<capnp::Data>&& o) { b.adoptPayload(kj::mv(o)); }));
}

float* payload(wire::FlatTensors::Builder b) {
  // Through a reader: Cap'n Proto hands out no builder of external data (written_blob's, writable memory of ours).
  return const_cast<float*>(reinterpret_cast<const float*>(b.asReader().getPayload().begin()));
}

namespace {

void check_header(wire::Envelope::Reader root) {
  if (root.getSchemaVersion() != wire::SCHEMA_VERSION)
    throw message_error(reject_reason::unknown_version, "schema version " + std::to_string(root.getSchemaVersion()) +
                                                            ", this build speaks " +
                                                            std::to_string(wire::SCHEMA_VERSION));
  read_address(root.getSource());
  read_address(root.getDestination());
}

capnp::ReaderOptions options_for(const message& m, const reader_limits& limits) {
  if (m.empty()) throw message_error(reject_reason::malformed, "empty message");
  if (m.bytes() > limits.max_bytes)
    throw message_error(reject_reason::too_large, "message of " + std::to_string(m.bytes()) + " bytes exceeds the " +
                                                      std::to_string(limits.max_bytes) + "-byte limit");
  capnp::ReaderOptions opts;
  // The message's own size bounds traversal: validation reads each word once
  // or twice, the receiver once more; a cyclic or amplified message stops here.
  opts.traversalLimitInWords = 4 * (m.bytes() / sizeof(capnp::word)) + 256;
  opts.nestingLimit = limits.nesting_limit;
  return opts;
}

std::atomic<uint64_t> opened_count{0};

std::unique_ptr<capnp::MessageReader> open_reader(const message& m, const capnp::ReaderOptions& opts) {
  opened_count.fetch_add(1, std::memory_order_relaxed);
  if (m.framed()) return std::make_unique<capnp::FlatArrayMessageReader>(m.segments()[0], opts);
  return std::make_unique<capnp::SegmentArrayMessageReader>(m.segments(), opts);
}

[[noreturn]] void rethrow_capnp(const kj::Exception& e) {
  std::string d = e.getDescription().cStr();
  bool big = d.find("traversal limit") != std::string::npos;
  throw message_error(big ? reject_reason::too_large : reject_reason::malformed, "malformed message: " + d);
}

} // namespace

envelope_reader::envelope_reader(const message& m, const reader_limits& limits) : m_(m) {
  const capnp::ReaderOptions opts = options_for(m, limits);
  try {
    reader_ = open_reader(m, opts);
    root_ = reader_->getRoot<wire::Envelope>();
    check_header(root_);
    kind_of(root_.which()).validate(root_, limits);  // net/protocol.cpp: one row per kind
  } catch (const kj::Exception& e) {
    rethrow_capnp(e);
  }
}

header read_header(const message& m) {
  reader_limits l;
  l.max_bytes = uint64_t(1) << 30;
  try {
    auto reader = open_reader(m, options_for(m, l));
    auto root = reader->getRoot<wire::Envelope>();
    check_header(root);
    return {root.which(), read_address(root.getSource()), read_address(root.getDestination())};
  } catch (const kj::Exception& e) {
    rethrow_capnp(e);
  }
}

envelope_reader::~envelope_reader() = default;

uint64_t messages_opened() { return opened_count.load(std::memory_order_relaxed); }

} // namespace troupe::net
