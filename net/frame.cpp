#include "net/frame.hpp"

#include <algorithm>
#include <cstring>

namespace troupe::net {

namespace {

template <typename T>
void store(std::byte* p, T v) {
  for (std::size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<std::byte>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff);
}

template <typename T>
T load(const std::byte* p) {
  uint64_t v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return static_cast<T>(v);
}

// Offsets of the fixed header (docs/protocol.md, "Frames").
constexpr std::size_t off_magic = 0, off_version = 4, off_kind = 5, off_flags = 6, off_segments = 8,
                      off_reserved0 = 12, off_sequence = 16, off_ack = 24, off_body = 32, off_node = 40,
                      off_role = 44, off_reserved1 = 45, off_index = 48, off_reserved2 = 52;

[[noreturn]] void fail(frame_error e, const std::string& what) {
  throw frame_exception(e, true, std::string("frame rejected (") + to_string(e) + "): " + what);
}

bool known_kind(uint8_t k) {
  switch (static_cast<frame_kind>(k)) {
    case frame_kind::message:
    case frame_kind::heartbeat:
    case frame_kind::goodbye:
    case frame_kind::message_ref:
    case frame_kind::lane_offer:
    case frame_kind::lane_accept:
    case frame_kind::hello:
    case frame_kind::challenge:
    case frame_kind::proof:
    case frame_kind::refuse: return true;
  }
  return false;
}

// A large body is read at most this much per read: copies from the socket
// into a cache-sized window measured faster (docs/benchmarks.md) than reads of
// everything the socket holds.
constexpr std::size_t max_direct_read = std::size_t(256) << 10;

bool is_control_with_body(frame_kind k) {
  return k == frame_kind::hello || k == frame_kind::challenge || k == frame_kind::proof || k == frame_kind::refuse ||
         k == frame_kind::lane_offer || k == frame_kind::lane_accept;
}

} // namespace

const char* to_string(frame_kind k) {
  switch (k) {
    case frame_kind::message: return "message";
    case frame_kind::heartbeat: return "heartbeat";
    case frame_kind::goodbye: return "goodbye";
    case frame_kind::message_ref: return "message_ref";
    case frame_kind::lane_offer: return "lane_offer";
    case frame_kind::lane_accept: return "lane_accept";
    case frame_kind::hello: return "hello";
    case frame_kind::challenge: return "challenge";
    case frame_kind::proof: return "proof";
    case frame_kind::refuse: return "refuse";
  }
  return "unknown";
}

const char* to_string(frame_error e) {
  switch (e) {
    case frame_error::bad_magic: return "bad_magic";
    case frame_error::bad_version: return "bad_version";
    case frame_error::bad_kind: return "bad_kind";
    case frame_error::bad_reserved: return "bad_reserved";
    case frame_error::bad_segments: return "bad_segments";
    case frame_error::bad_length: return "bad_length";
    case frame_error::too_large: return "too_large";
    case frame_error::unexpected_kind: return "unexpected_kind";
    case frame_error::bad_envelope: return "bad_envelope";
    case frame_error::bad_tag: return "bad_tag";
    case frame_error::wrong_source: return "wrong_source";
    case frame_error::frame_timeout: return "frame_timeout";
    case frame_error::bad_lane: return "bad_lane";
  }
  return "unknown";
}

void encode_header(const frame_header& h, std::byte* out) {
  std::memset(out, 0, frame_header_bytes);
  store<uint32_t>(out + off_magic, frame_magic);
  store<uint8_t>(out + off_version, frame_version);
  store<uint8_t>(out + off_kind, static_cast<uint8_t>(h.kind));
  store<uint32_t>(out + off_segments, h.segments);
  store<uint64_t>(out + off_sequence, h.sequence);
  store<uint64_t>(out + off_ack, h.ack);
  store<uint64_t>(out + off_body, h.body_bytes);
  store<uint32_t>(out + off_node, h.destination.node);
  store<uint8_t>(out + off_role, static_cast<uint8_t>(h.destination.role));
  store<uint32_t>(out + off_index, h.destination.index);
}

std::size_t segment_table_bytes(uint32_t segments) { return (static_cast<std::size_t>(segments) * 4 + 7) / 8 * 8; }

frame_header decode_header(const std::byte* in, uint64_t max_frame_bytes) {
  const uint32_t magic = load<uint32_t>(in + off_magic);
  if (magic != frame_magic) fail(frame_error::bad_magic, "magic " + std::to_string(magic) + " is not a troupe frame's");
  const uint8_t version = load<uint8_t>(in + off_version);
  if (version != frame_version)
    fail(frame_error::bad_version,
         "frame version " + std::to_string(version) + ", this build speaks " + std::to_string(frame_version));
  const uint8_t kind = load<uint8_t>(in + off_kind);
  if (!known_kind(kind)) fail(frame_error::bad_kind, "unknown frame kind " + std::to_string(kind));
  if (load<uint16_t>(in + off_flags) != 0 || load<uint32_t>(in + off_reserved0) != 0 ||
      load<uint8_t>(in + off_reserved1) != 0 || load<uint16_t>(in + off_reserved1 + 1) != 0 ||
      load<uint32_t>(in + off_reserved2) != 0)
    fail(frame_error::bad_reserved, "flags or reserved fields set");

  frame_header h;
  h.kind = static_cast<frame_kind>(kind);
  h.segments = load<uint32_t>(in + off_segments);
  h.sequence = load<uint64_t>(in + off_sequence);
  h.ack = load<uint64_t>(in + off_ack);
  h.body_bytes = load<uint64_t>(in + off_body);
  const uint32_t node = load<uint32_t>(in + off_node), index = load<uint32_t>(in + off_index);
  const uint8_t role_value = load<uint8_t>(in + off_role);

  if (max_frame_bytes < frame_header_bytes || h.body_bytes > max_frame_bytes - frame_header_bytes)
    fail(frame_error::too_large, "body of " + std::to_string(h.body_bytes) + " bytes exceeds the " +
                                     std::to_string(max_frame_bytes) + "-byte frame limit");
  if (carries_message(h.kind)) {
    if (h.segments == 0 || h.segments > max_frame_segments)
      fail(frame_error::bad_segments, std::to_string(h.segments) + " segments (1.." +
                                          std::to_string(max_frame_segments) + " allowed)");
    if (h.sequence == 0) fail(frame_error::bad_reserved, "message frame with sequence number 0");
    if (role_value >= roles) fail(frame_error::bad_reserved, "unknown role " + std::to_string(role_value));
    const uint64_t table = segment_table_bytes(h.segments);
    if (h.kind == frame_kind::message_ref && h.body_bytes != table + message_ref_bytes)
      fail(frame_error::bad_length, "message_ref frame of " + std::to_string(h.body_bytes) + " bytes, not the " +
                                        std::to_string(table + message_ref_bytes) + " its " +
                                        std::to_string(h.segments) + " segments take");
    if (h.kind == frame_kind::message && (h.body_bytes < table + 8 * uint64_t(h.segments) || (h.body_bytes - table) % 8 != 0))
      fail(frame_error::bad_length, "body of " + std::to_string(h.body_bytes) + " bytes cannot hold " +
                                        std::to_string(h.segments) + " segments");
    h.destination = {node, static_cast<role>(role_value), index};
    return h;
  }
  if (h.segments != 0 || h.sequence != 0 || node != 0 || role_value != 0 || index != 0)
    fail(frame_error::bad_reserved, std::string(to_string(h.kind)) + " frame with message fields set");
  if (is_control_with_body(h.kind)) {
    if (h.ack != 0) fail(frame_error::bad_reserved, std::string(to_string(h.kind)) + " frame with an ack");
    if (h.body_bytes == 0 || h.body_bytes > max_control_body)
      fail(frame_error::bad_length, std::string(to_string(h.kind)) + " frame of " + std::to_string(h.body_bytes) +
                                        " bytes (1.." + std::to_string(max_control_body) + " allowed)");
  } else if (h.body_bytes != 0) {
    fail(frame_error::bad_length, std::string(to_string(h.kind)) + " frame with a body");
  }
  return h;
}

void check_segment_table(const frame_header& h, const uint32_t* sizes) {
  uint64_t words = 0;
  for (uint32_t i = 0; i < h.segments; ++i) {
    if (sizes[i] == 0) fail(frame_error::bad_segments, "segment " + std::to_string(i) + " is empty");
    words += sizes[i];
  }
  if (h.kind == frame_kind::message_ref) return;  // the reference's size is checked against them
  const uint64_t expected = h.body_bytes - segment_table_bytes(h.segments);
  if (words * 8 != expected)
    fail(frame_error::bad_length, "segments of " + std::to_string(words * 8) + " bytes in a body of " +
                                      std::to_string(expected) + " bytes after the table");
}

std::vector<kj::ArrayPtr<const capnp::word>> wire_segments(const message& m) {
  auto segs = m.segments();
  std::vector<kj::ArrayPtr<const capnp::word>> out;
  if (!m.framed()) {
    out.assign(segs.begin(), segs.end());
    return out;
  }
  // Cap'n Proto's stream framing: (count - 1), count sizes (u32 words), padding to 8 bytes, the segments.
  const auto all = segs[0];
  const std::byte* p = reinterpret_cast<const std::byte*>(all.begin());
  const std::size_t total = all.size();
  auto bad = [](const std::string& why) { return message_error(reject_reason::malformed, "framed message: " + why); };
  if (total < 1) throw bad("empty");
  const uint64_t count = uint64_t(load<uint32_t>(p)) + 1;
  if (count > max_frame_segments) throw bad(std::to_string(count) + " segments");
  const uint64_t table_words = (4 + 4 * count + 7) / 8;
  if (table_words > total) throw bad("truncated segment table");
  uint64_t at = table_words;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t n = load<uint32_t>(p + 4 + 4 * i);
    if (n == 0 || n > total - at) throw bad("segment " + std::to_string(i) + " exceeds the buffer");
    out.emplace_back(all.begin() + at, n);
    at += n;
  }
  return out;
}

void out_frame::set_ack(uint64_t ack) { store<uint64_t>(head.data() + off_ack, ack); }

void out_frame::set_sequence(uint64_t s) {
  sequence = s;
  store<uint64_t>(head.data() + off_sequence, s);
}

void out_frame::seal(frame_cipher& c, const std::shared_ptr<buffer_pool>& pool) {
  c.begin();
  // The header, a message's segment table, a message_ref's reference or a lane frame's body: all in `head`.
  c.authenticate(head.data(), head.size());
  cipher.reset();
  cipher_bytes = 0;
  if (c.confidential() && !segments.empty()) {
    for (auto& s : segments) cipher_bytes += s.size() * sizeof(capnp::word);
    cipher = (pool ? pool : buffer_pool::create(0))->acquire(cipher_bytes);
  }
  std::size_t at = 0;
  for (auto& s : segments) {
    const auto* p = reinterpret_cast<const std::byte*>(s.begin());
    const std::size_t n = s.size() * sizeof(capnp::word);
    c.payload(p, cipher ? cipher->data() + at : const_cast<std::byte*>(p), n);
    at += n;
  }
  tag = c.finish();
  sealed = true;
}

std::size_t out_frame::plain_bytes() const {
  std::size_t n = head.size();
  for (auto& s : segments) n += s.size() * sizeof(capnp::word);
  return n;
}

std::size_t out_frame::bytes() const {
  std::size_t n = 0;
  for_each_piece([&](const std::byte*, std::size_t b) { n += b; });
  return n;
}

out_frame make_message_frame(const address& destination, const message& m, uint64_t sequence) {
  out_frame f;
  f.kind = frame_kind::message;
  f.sequence = sequence;
  f.msg = m;
  f.segments = wire_segments(m);
  if (f.segments.empty() || f.segments.size() > max_frame_segments)
    throw error("make_message_frame: a message of " + std::to_string(f.segments.size()) + " segments (1.." +
                std::to_string(max_frame_segments) + " allowed)");
  frame_header h;
  h.kind = frame_kind::message;
  h.segments = static_cast<uint32_t>(f.segments.size());
  h.sequence = sequence;
  h.destination = destination;
  const std::size_t table = segment_table_bytes(h.segments);
  h.body_bytes = table;
  for (auto& s : f.segments) h.body_bytes += s.size() * sizeof(capnp::word);
  f.head.resize(frame_header_bytes + table);
  encode_header(h, f.head.data());
  for (std::size_t i = 0; i < f.segments.size(); ++i)
    store<uint32_t>(f.head.data() + frame_header_bytes + 4 * i, static_cast<uint32_t>(f.segments[i].size()));
  return f;
}

out_frame make_message_ref_frame(const out_frame& message_frame, const message_ref& r) {
  if (message_frame.kind != frame_kind::message)
    throw error("make_message_ref_frame: made from a message frame, not a " + std::string(to_string(message_frame.kind)));
  out_frame f;
  f.kind = frame_kind::message_ref;
  f.sequence = message_frame.sequence;
  f.head = message_frame.head;  // its header and segment table, and nothing else
  store<uint8_t>(f.head.data() + off_kind, static_cast<uint8_t>(frame_kind::message_ref));
  store<uint64_t>(f.head.data() + off_body, f.head.size() - frame_header_bytes + message_ref_bytes);
  f.head.resize(f.head.size() + message_ref_bytes);
  std::byte* at = f.head.data() + f.head.size() - message_ref_bytes;
  store<uint64_t>(at, r.lane);
  store<uint64_t>(at + 8, r.offset);
  store<uint64_t>(at + 16, r.bytes);
  return f;
}

message_ref decode_message_ref(const std::vector<std::byte>& body) {
  if (body.size() != message_ref_bytes)
    throw frame_exception(frame_error::bad_length, false, "a message_ref of " + std::to_string(body.size()) + " bytes");
  return {load<uint64_t>(body.data()), load<uint64_t>(body.data() + 8), load<uint64_t>(body.data() + 16)};
}

out_frame make_control_frame(frame_kind kind, const void* body, std::size_t bytes, uint64_t ack) {
  out_frame f;
  f.kind = kind;
  frame_header h;
  h.kind = kind;
  h.ack = ack;
  h.body_bytes = bytes;
  f.head.resize(frame_header_bytes + bytes);
  encode_header(h, f.head.data());
  if (bytes) std::memcpy(f.head.data() + frame_header_bytes, body, bytes);
  return f;
}

frame_reader::frame_reader(uint64_t max_frame_bytes, std::shared_ptr<buffer_pool> pool, std::size_t staging_bytes)
    : max_frame_(max_frame_bytes), pool_(std::move(pool)) {
  capacity_ = std::max<std::size_t>(staging_bytes, frame_header_bytes + segment_table_bytes(max_frame_segments) +
                                                       max_control_body) /
              8 * 8;
  staging_.reset(new uint64_t[capacity_ / 8]);
}

kj::ArrayPtr<std::byte> frame_reader::next_buffer() {
  std::byte* base = reinterpret_cast<std::byte*>(staging_.get());
  // A large rest of a body goes straight into its buffer (staging is empty then: next() drained it).
  direct_ = state_ == state::body && available() == 0 && body_needed_ - body_filled_ >= capacity_ / 4;
  if (direct_) {
    make_room();
    return kj::arrayPtr(body_->data() + body_filled_, std::min(body_room_ - body_filled_, max_direct_read));
  }
  if (begin_ == end_) begin_ = end_ = 0;
  if (capacity_ - end_ < capacity_ / 4 && begin_ > 0) {
    std::memmove(base, base + begin_, available());
    end_ -= begin_;
    begin_ = 0;
  }
  return kj::arrayPtr(base + end_, capacity_ - end_);
}

void frame_reader::commit(std::size_t n) {
  if (direct_) {
    direct_ = false;
    body_arrived(n);
  } else {
    end_ += n;
  }
}

// The body's buffer is full and more is coming: a larger one, the bytes so far copied over.
void frame_reader::make_room() {
  if (body_filled_ < body_room_ || body_filled_ >= body_needed_) return;
  const std::size_t room = std::min(body_needed_, std::max(body_room_ * 4, initial_frame_grant));
  auto bigger = pool_->acquire(room);
  std::memcpy(bigger->data(), body_->data(), body_filled_);
  body_ = std::move(bigger);
  body_room_ = room;
}

// `n` more bytes of the body are in place at body_filled_: authenticated (decrypted) as they come, while in cache.
void frame_reader::body_arrived(std::size_t n) {
  std::byte* at = body_->data() + body_filled_;
  if (opener_) opener_->payload(at, at, n);
  body_filled_ += n;
}

bool frame_reader::finish_message(in_frame& out) {
  out.header = header_;
  out.body.clear();
  out.source = {};
  earned_ = std::max(earned_, body_needed_);
  auto* words = reinterpret_cast<const capnp::word*>(body_->data());
  out.msg = message::from_segments(std::move(body_), words, kj::arrayPtr(sizes_.data(), sizes_.size()));
  body_room_ = 0;
  state_ = state::header;
  if (check_envelopes_) {
    try {
      out.source = read_header(out.msg).source;
    } catch (const message_error& e) {
      out.msg = message();
      throw frame_exception(frame_error::bad_envelope, false,
                            std::string("frame rejected (bad_envelope): ") + e.what());
    }
  }
  return true;
}

// The frame read (and, protected, verified) whole: hands it out.
bool frame_reader::deliver(in_frame& out) {
  if (header_.kind == frame_kind::message) return finish_message(out);
  out.header = header_;
  out.msg = message();
  out.source = {};
  out.sizes.clear();
  if (header_.kind == frame_kind::message_ref) out.sizes = sizes_;
  out.body.swap(control_body_);
  control_body_.clear();
  state_ = state::header;
  return true;
}

// The frame's bytes are all in: to its tag when the stream is protected, else out.
frame_reader::step frame_reader::complete(in_frame& out) {
  if (opener_) {
    state_ = state::tag;
    return step::again;
  }
  deliver(out);
  return step::frame;
}

frame_reader::step frame_reader::take_header(in_frame& out) {
  const std::byte* base = reinterpret_cast<const std::byte*>(staging_.get());
  if (available() < frame_header_bytes) return step::more;
  header_ = decode_header(base + begin_, max_frame_);
  if (!(allowed_ & kind_bit(header_.kind)))
    fail(frame_error::unexpected_kind, std::string(to_string(header_.kind)) + " frame not allowed now");
  if (opener_) {
    opener_->begin();
    opener_->authenticate(base + begin_, frame_header_bytes);
  }
  begin_ += frame_header_bytes;
  control_body_.clear();
  if (carries_message(header_.kind)) {
    state_ = state::table;
    return step::again;
  }
  if (header_.body_bytes > 0) {
    state_ = state::control;
    return step::again;
  }
  return complete(out);
}

frame_reader::step frame_reader::take_table() {
  const std::byte* base = reinterpret_cast<const std::byte*>(staging_.get());
  const std::size_t table = segment_table_bytes(header_.segments);
  if (available() < table) return step::more;
  sizes_.resize(header_.segments);
  for (uint32_t i = 0; i < header_.segments; ++i) sizes_[i] = load<uint32_t>(base + begin_ + 4 * i);
  check_segment_table(header_, sizes_.data());
  if (opener_) opener_->authenticate(base + begin_, table);
  begin_ += table;
  if (header_.kind == frame_kind::message_ref) {
    state_ = state::control;  // the reference: read as a control body
    return step::again;
  }
  body_needed_ = header_.body_bytes - table;
  body_filled_ = 0;
  // Only as much buffer as this stream has shown it sends: more as the bytes arrive.
  body_room_ = body_needed_ <= earned_ ? body_needed_ : std::min(body_needed_, initial_frame_grant);
  body_ = pool_->acquire(body_room_);
  state_ = state::body;
  return step::again;
}

frame_reader::step frame_reader::take_body(in_frame& out) {
  const std::byte* base = reinterpret_cast<const std::byte*>(staging_.get());
  make_room();
  const std::size_t n = std::min(available(), body_room_ - body_filled_);
  if (n) {
    if (opener_)
      opener_->payload(base + begin_, body_->data() + body_filled_, n);
    else
      std::memcpy(body_->data() + body_filled_, base + begin_, n);
    body_filled_ += n;
    begin_ += n;
  }
  if (body_filled_ < body_needed_) return available() == 0 ? step::more : step::again;  // full: make_room() grows it
  return complete(out);
}

frame_reader::step frame_reader::take_control(in_frame& out) {
  const std::byte* base = reinterpret_cast<const std::byte*>(staging_.get());
  const std::size_t bytes =
      header_.kind == frame_kind::message_ref ? message_ref_bytes : static_cast<std::size_t>(header_.body_bytes);
  if (available() < bytes) return step::more;
  control_body_.assign(base + begin_, base + begin_ + bytes);
  begin_ += bytes;
  // Protected bodies (lane frames, a message_ref's reference) are authenticated, never encrypted.
  if (opener_) opener_->authenticate(control_body_.data(), control_body_.size());
  return complete(out);
}

frame_reader::step frame_reader::take_tag(in_frame& out) {
  const std::byte* base = reinterpret_cast<const std::byte*>(staging_.get());
  if (available() < frame_tag_bytes) return step::more;
  frame_tag tag;
  std::memcpy(tag.data(), base + begin_, frame_tag_bytes);
  begin_ += frame_tag_bytes;
  if (!opener_->verify(tag)) {
    body_.reset();
    fail(frame_error::bad_tag, std::string(to_string(header_.kind)) + " frame " + std::to_string(opener_->frames()) +
                                   " of the link fails its tag: altered, forged, replayed or out of order");
  }
  deliver(out);
  return step::frame;
}

bool frame_reader::next(in_frame& out) {
  if (poisoned_) throw frame_exception(frame_error::bad_magic, true, "frame reader used after a fatal error");
  try {
    for (;;) {
      step s = step::more;
      switch (state_) {
        case state::header: s = take_header(out); break;
        case state::table: s = take_table(); break;
        case state::body: s = take_body(out); break;
        case state::control: s = take_control(out); break;
        case state::tag: s = take_tag(out); break;
      }
      if (s != step::again) return s == step::frame;
    }
  } catch (const frame_exception& e) {
    if (e.fatal()) poisoned_ = true;
    throw;
  }
}

} // namespace troupe::net
