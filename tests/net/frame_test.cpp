#include <capnp/serialize.h>
#include <catch2/catch.hpp>
#include <openssl/evp.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "net/frame.hpp"
#include "tests/net/net_test_util.hpp"

using namespace troupe;
using namespace troupe::net;
using troupe::testing::tensor_message;
using troupe::testing::tensor_message_intact;

namespace {

using bytes = std::vector<std::byte>;

const address from{1, role::worker, 3}, to{0, role::shard, 2};

// The frame as it goes on the wire: head, then the segments.
bytes on_wire(const out_frame& f) {
  bytes out(f.head.begin(), f.head.end());
  for (auto& s : f.segments) {
    auto* p = reinterpret_cast<const std::byte*>(s.begin());
    out.insert(out.end(), p, p + s.size() * sizeof(capnp::word));
  }
  return out;
}

// Feeds `in` to `r` at most `chunk` bytes per read, as a socket would; returns the frames.
std::vector<in_frame> feed(frame_reader& r, const bytes& in, std::size_t chunk) {
  std::vector<in_frame> out;
  std::size_t at = 0;
  for (;;) {
    in_frame f;
    while (r.next(f)) out.push_back(std::move(f));
    if (at == in.size()) break;
    auto buf = r.next_buffer();
    const std::size_t n = std::min({buf.size(), chunk, in.size() - at});
    std::memcpy(buf.begin(), in.data() + at, n);
    r.commit(n);
    at += n;
  }
  return out;
}

frame_reader make_reader(uint64_t max_frame = uint64_t(1) << 30) {
  return frame_reader(max_frame, buffer_pool::create());
}

template <typename T>
void put(bytes& b, std::size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof v);  // x86: little-endian, as the frame
}

frame_error error_of(bytes in, uint32_t allowed = ~uint32_t(0), uint64_t max_frame = uint64_t(1) << 30) {
  auto r = make_reader(max_frame);
  r.allow(allowed);
  try {
    feed(r, in, in.size());
  } catch (const frame_exception& e) {
    return e.reason();
  }
  FAIL("frame accepted");
  return frame_error::bad_magic;
}

} // namespace

TEST_CASE("frames: a message round-trips, read in place from an aligned pooled buffer", "[net][frame]") {
  for (std::size_t size : {std::size_t(4), std::size_t(4096), std::size_t(1) << 20}) {
    for (std::size_t chunk : {std::size_t(1), std::size_t(7), std::size_t(4096), std::size_t(1) << 30}) {
      if (chunk < 64 && size > 4096) continue;  // slow, and nothing new
      const message m = tensor_message(from, to, size, 7);
      out_frame f = make_message_frame({2, role::loader, 5}, m, 42);
      f.set_ack(17);
      auto r = make_reader();
      auto frames = feed(r, on_wire(f), chunk);
      REQUIRE(frames.size() == 1);
      const in_frame& got = frames[0];
      CHECK(got.header.kind == frame_kind::message);
      CHECK(got.header.sequence == 42);
      CHECK(got.header.ack == 17);
      CHECK(got.header.destination == address{2, role::loader, 5});
      REQUIRE(got.msg.segments().size() == m.segments().size());
      for (auto& s : got.msg.segments()) CHECK(reinterpret_cast<uintptr_t>(s.begin()) % 8 == 0);
      CHECK(got.msg.bytes() == m.bytes());
      CHECK(tensor_message_intact(got.msg, size));
      CHECK_FALSE(r.mid_frame());
    }
  }
}

TEST_CASE("frames: a large body is read straight into its buffer, a tensor viewed in place", "[net][frame]") {
  const std::size_t size = 4 << 20;
  const message m = tensor_message(from, to, size, 3);
  const bytes w = on_wire(make_message_frame(to, m, 1));
  auto r = make_reader();
  std::size_t at = 0, direct = 0;
  in_frame f;
  bool done = false;
  while (!done) {
    auto buf = r.next_buffer();
    if (buf.size() > (64 << 10)) ++direct;
    const std::size_t n = std::min(buf.size(), w.size() - at);
    std::memcpy(buf.begin(), w.data() + at, n);
    r.commit(n);
    at += n;
    done = r.next(f);
  }
  CHECK(direct >= 1);
  envelope_reader er(f.msg, peer_limits());
  auto v = view(er.root().getActivation().getTensor(), "t");
  const auto* seg = f.msg.segments()[0].begin();
  CHECK(reinterpret_cast<const std::byte*>(v.data) > reinterpret_cast<const std::byte*>(seg));
  CHECK(reinterpret_cast<const std::byte*>(v.data) < reinterpret_cast<const std::byte*>(seg) + f.msg.bytes());
}

TEST_CASE("frames: a message of many segments round-trips", "[net][frame]") {
  auto b = std::make_unique<capnp::MallocMessageBuilder>(16, capnp::AllocationStrategy::FIXED_SIZE);
  auto env = init_envelope(*b, from, to);
  auto t = env.initActivation().initTensor();
  t.setDtype(wire::DType::F32);
  t.initShape(1).set(0, 64);
  auto d = t.initData(256);
  for (std::size_t i = 0; i < 64; ++i) reinterpret_cast<float*>(d.begin())[i] = float(i);
  const message m = message::from_builder(std::move(b));
  REQUIRE(m.segments().size() > 2);
  auto r = make_reader();
  auto frames = feed(r, on_wire(make_message_frame(to, m, 1)), 13);
  REQUIRE(frames.size() == 1);
  CHECK(frames[0].msg.segments().size() == m.segments().size());
  envelope_reader er(frames[0].msg, peer_limits());
  auto v = view(er.root().getActivation().getTensor(), "t");
  CHECK(v.data[63] == 63.0f);
}

TEST_CASE("frames: receive buffers go back to the pool and are reused", "[net][frame]") {
  auto pool = buffer_pool::create();
  frame_reader r(uint64_t(1) << 30, pool);
  const message m = tensor_message(from, to, 1 << 20, 1);
  const bytes w = on_wire(make_message_frame(to, m, 1));
  const void* first = nullptr;
  for (int i = 0; i < 5; ++i) {
    auto frames = feed(r, w, w.size());
    REQUIRE(frames.size() == 1);
    if (i == 0) first = frames[0].msg.segments()[0].begin();
    CHECK(frames[0].msg.segments()[0].begin() == first);
  }  // each frame's message is let go here
  CHECK(pool->stats().allocations == 1);
  CHECK(pool->stats().reuses == 4);

  // A message still held keeps its buffer: the next frame gets another.
  auto held = feed(r, w, w.size());
  auto next = feed(r, w, w.size());
  CHECK(held[0].msg.segments()[0].begin() != next[0].msg.segments()[0].begin());
  CHECK(tensor_message_intact(held[0].msg, 1 << 20));
}

TEST_CASE("frames: a pooled buffer wastes at most a quarter of what it holds", "[net][frame]") {
  constexpr std::size_t mib = std::size_t(1) << 20;
  std::size_t last = 0;
  for (std::size_t bytes = 1; bytes <= 70 * mib; bytes += bytes < 4096 ? 1 : bytes / 97) {
    const std::size_t c = buffer_pool::capacity_for(bytes);
    INFO("bytes " << bytes << ", capacity " << c);
    CHECK(c >= bytes);
    CHECK(c % 64 == 0);
    CHECK(c >= last);  // a larger request never gets a smaller buffer
    if (bytes > 256) CHECK(c - bytes < bytes / 4 + 64);
    last = c;
  }
  // A collective's piece of 65 536 floats with its envelope: 320 KiB, not 512.
  CHECK(buffer_pool::capacity_for(262144 + 200) == 320 * 1024);
  CHECK(buffer_pool::capacity_for(64 * mib + 100) == 65 * mib);
}

TEST_CASE("frames: several frames in one read, control frames, bodies", "[net][frame]") {
  bytes all;
  auto append = [&](const out_frame& f) {
    auto w = on_wire(f);
    all.insert(all.end(), w.begin(), w.end());
  };
  const std::string hello = "hello body";
  append(make_control_frame(frame_kind::heartbeat, nullptr, 0, 9));
  append(make_message_frame(to, tensor_message(from, to, 64, 1), 1));
  append(make_control_frame(frame_kind::hello, hello.data(), hello.size()));
  append(make_message_frame(to, tensor_message(from, to, 8192, 2), 2));
  append(make_control_frame(frame_kind::goodbye));
  for (std::size_t chunk : {std::size_t(1), std::size_t(100), all.size()}) {
    auto r = make_reader();
    auto frames = feed(r, all, chunk);
    REQUIRE(frames.size() == 5);
    CHECK(frames[0].header.kind == frame_kind::heartbeat);
    CHECK(frames[0].header.ack == 9);
    CHECK(tensor_message_intact(frames[1].msg, 64));
    CHECK(std::string(reinterpret_cast<const char*>(frames[2].body.data()), frames[2].body.size()) == hello);
    CHECK(tensor_message_intact(frames[3].msg, 8192));
    CHECK(frames[4].header.kind == frame_kind::goodbye);
  }
}

TEST_CASE("frames: a message from bytes (stream framing) is framed by its real segments", "[net][frame]") {
  auto b = std::make_unique<capnp::MallocMessageBuilder>(16, capnp::AllocationStrategy::FIXED_SIZE);
  init_envelope(*b, from, to).initControl().setDetail("a detail long enough for several segments of sixteen words");
  auto flat = capnp::messageToFlatArray(*b);
  const message m = message::from_bytes(flat.begin(), flat.size() * sizeof(capnp::word));
  auto segs = wire_segments(m);
  CHECK(segs.size() == b->getSegmentsForOutput().size());
  auto r = make_reader();
  auto frames = feed(r, on_wire(make_message_frame(to, m, 1)), 64);
  REQUIRE(frames.size() == 1);
  envelope_reader er(frames[0].msg);
  CHECK(std::string(er.root().getControl().getDetail().cStr()).find("several segments") != std::string::npos);

  const std::vector<uint32_t> bad = {5, 0};  // claims 6 segments in 8 bytes
  CHECK_THROWS_AS(wire_segments(message::from_bytes(bad.data(), 8)), message_error);
}

TEST_CASE("frames: every malformed header is rejected before a length is trusted", "[net][frame]") {
  const bytes good = on_wire(make_message_frame(to, tensor_message(from, to, 64, 1), 5));
  const bytes hb = on_wire(make_control_frame(frame_kind::heartbeat));
  const std::string text = "x";
  const bytes hello = on_wire(make_control_frame(frame_kind::hello, text.data(), 1));
  auto with = [](bytes b, auto f) {
    f(b);
    return b;
  };
  CHECK(error_of(with(good, [](bytes& b) { b[0] = std::byte{'X'}; })) == frame_error::bad_magic);
  CHECK(error_of(with(good, [](bytes& b) { put<uint8_t>(b, 4, 2); })) == frame_error::bad_version);
  CHECK(error_of(with(good, [](bytes& b) { put<uint8_t>(b, 5, 0); })) == frame_error::bad_kind);
  CHECK(error_of(with(good, [](bytes& b) { put<uint8_t>(b, 5, 77); })) == frame_error::bad_kind);
  CHECK(error_of(with(good, [](bytes& b) { put<uint16_t>(b, 6, 1); })) == frame_error::bad_reserved);
  CHECK(error_of(with(good, [](bytes& b) { put<uint32_t>(b, 12, 1); })) == frame_error::bad_reserved);
  CHECK(error_of(with(good, [](bytes& b) { put<uint8_t>(b, 46, 1); })) == frame_error::bad_reserved);
  CHECK(error_of(with(good, [](bytes& b) { put<uint32_t>(b, 52, 1); })) == frame_error::bad_reserved);
  CHECK(error_of(with(good, [](bytes& b) { put<uint64_t>(b, 16, 0); })) == frame_error::bad_reserved);    // sequence 0
  CHECK(error_of(with(good, [](bytes& b) { put<uint8_t>(b, 44, net::roles); })) == frame_error::bad_reserved);  // role
  CHECK(error_of(with(good, [](bytes& b) { put<uint32_t>(b, 8, 0); })) == frame_error::bad_segments);
  CHECK(error_of(with(good, [](bytes& b) { put<uint32_t>(b, 8, 513); })) == frame_error::bad_segments);
  CHECK(error_of(with(good, [](bytes& b) { put<uint32_t>(b, 8, 0xffffffffu); })) == frame_error::bad_segments);
  CHECK(error_of(with(good, [](bytes& b) { put<uint64_t>(b, 32, 8); })) == frame_error::bad_length);
  CHECK(error_of(with(good, [](bytes& b) { put<uint64_t>(b, 32, 8 + 8 + 4); })) == frame_error::bad_length);
  CHECK(error_of(with(good, [](bytes& b) { put<uint64_t>(b, 32, ~uint64_t(0)); })) == frame_error::too_large);
  CHECK(error_of(with(good, [](bytes& b) { put<uint64_t>(b, 32, uint64_t(1) << 62); })) == frame_error::too_large);
  CHECK(error_of(good, ~uint32_t(0), 64) == frame_error::too_large);
  // The segment table: sizes that do not add up to the body, an empty segment.
  CHECK(error_of(with(good, [](bytes& b) { put<uint32_t>(b, 56, 1); })) == frame_error::bad_length);
  CHECK(error_of(with(good, [](bytes& b) { put<uint32_t>(b, 56, 0xffffffffu); })) == frame_error::bad_length);
  CHECK(error_of(with(good, [](bytes& b) { put<uint32_t>(b, 56, 0); })) == frame_error::bad_segments);
  // Fields a kind does not use.
  CHECK(error_of(with(hb, [](bytes& b) { put<uint64_t>(b, 32, 8); })) == frame_error::bad_length);
  CHECK(error_of(with(hb, [](bytes& b) { put<uint32_t>(b, 40, 1); })) == frame_error::bad_reserved);
  CHECK(error_of(with(hb, [](bytes& b) { put<uint64_t>(b, 16, 3); })) == frame_error::bad_reserved);
  CHECK(error_of(with(hb, [](bytes& b) { put<uint32_t>(b, 8, 1); })) == frame_error::bad_reserved);
  CHECK(error_of(with(hello, [](bytes& b) { put<uint64_t>(b, 24, 1); })) == frame_error::bad_reserved);
  CHECK(error_of(with(hello, [](bytes& b) { put<uint64_t>(b, 32, 0); })) == frame_error::bad_length);
  CHECK(error_of(with(hello, [](bytes& b) { put<uint64_t>(b, 32, max_control_body + 1); })) ==
        frame_error::bad_length);
  // A kind not allowed now: its body is never read.
  CHECK(error_of(good, kind_bit(frame_kind::hello)) == frame_error::unexpected_kind);
  CHECK(error_of(hello, kind_bit(frame_kind::message)) == frame_error::unexpected_kind);
}

TEST_CASE("frames: segments that are no envelope are rejected, the stream goes on", "[net][frame]") {
  auto pool = buffer_pool::create();
  std::vector<capnp::word> garbage(8);
  std::memset(static_cast<void*>(garbage.data()), 0xab, garbage.size() * 8);
  const message junk = message::from_segments(nullptr, garbage.data(), kj::arrayPtr(std::vector<uint32_t>{8}.data(), 1));
  bytes all = on_wire(make_message_frame(to, junk, 1));
  const bytes good = on_wire(make_message_frame(to, tensor_message(from, to, 128, 4), 2));
  all.insert(all.end(), good.begin(), good.end());
  frame_reader r(uint64_t(1) << 30, pool);
  std::size_t at = 0;
  auto buf = r.next_buffer();
  std::memcpy(buf.begin(), all.data(), all.size());
  r.commit(all.size());
  in_frame f;
  try {
    r.next(f);
    FAIL("junk accepted");
  } catch (const frame_exception& e) {
    CHECK(e.reason() == frame_error::bad_envelope);
    CHECK_FALSE(e.fatal());
  }
  REQUIRE(r.next(f));
  CHECK(f.header.sequence == 2);
  CHECK(tensor_message_intact(f.msg, 128));
  (void)at;
}

TEST_CASE("frames: a reader is unusable after a fatal error", "[net][frame]") {
  bytes b = on_wire(make_control_frame(frame_kind::heartbeat));
  b[0] = std::byte{0};
  auto r = make_reader();
  auto buf = r.next_buffer();
  std::memcpy(buf.begin(), b.data(), b.size());
  r.commit(b.size());
  in_frame f;
  CHECK_THROWS_AS(r.next(f), frame_exception);
  CHECK_THROWS_AS(r.next(f), frame_exception);
}

TEST_CASE("frames: random bytes and random mutations never crash the reader", "[net][frame]") {
  std::mt19937_64 rng(12345);
  const bytes good = on_wire(make_message_frame(to, tensor_message(from, to, 256, 1), 1));
  int rejected = 0, accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    bytes b = good;
    if (i % 4 == 0) {
      b.resize(rng() % 400);
      for (auto& x : b) x = std::byte(rng());
    } else {
      const int flips = 1 + rng() % 4;
      for (int k = 0; k < flips; ++k) b[rng() % b.size()] = std::byte(rng());
    }
    auto r = make_reader(1 << 20);
    try {
      for (auto& f : feed(r, b, 1 + rng() % 300)) {
        if (!f.msg.empty()) {
          ++accepted;
          try {
            envelope_reader er(f.msg, peer_limits());
          } catch (const message_error&) {
          }
        }
      }
    } catch (const frame_exception&) {
      ++rejected;
    }
  }
  // A flipped byte of a tensor payload still makes a valid frame; most others do not.
  CHECK(rejected > 5000);
  CHECK(accepted > 0);
}

TEST_CASE("envelope_reader follows every pointer a receiver reads (found by the fuzzer)", "[net][frame]") {
  // A Control whose detail Text points outside its segment: rejected when the
  // envelope is read, not later as a kj::Exception in the receiver.
  auto b = make_builder(64);
  init_envelope(*b, from, to).initControl().setDetail("abc");
  auto segs = b->getSegmentsForOutput();
  REQUIRE(segs.size() == 1);
  std::vector<uint64_t> words(segs[0].size());
  std::memcpy(words.data(), segs[0].begin(), words.size() * 8);
  int patched = 0;
  for (auto& w : words)
    if ((w & 3) == 1 && ((w >> 32) & 7) == 2 && (w >> 35) == 4) {  // a list of 4 bytes: "abc\0"
      w = (w & ~uint64_t(0xfffffffc)) | (uint64_t(0x1000000) << 2);
      ++patched;
    }
  REQUIRE(patched == 1);
  const uint32_t size = static_cast<uint32_t>(words.size());
  const message m = message::from_segments(nullptr, reinterpret_cast<const capnp::word*>(words.data()),
                                           kj::arrayPtr(&size, 1));
  CHECK_NOTHROW(read_header(m));
  CHECK_THROWS_AS(envelope_reader(m), message_error);
}

namespace {

frame_key key_of(uint8_t v) {
  frame_key k{};
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = static_cast<uint8_t>(v + i);
  return k;
}

bytes sealed_on_wire(out_frame f, frame_cipher& c) {
  f.seal(c);
  bytes out;
  f.for_each_piece([&](const std::byte* d, std::size_t n) { out.insert(out.end(), d, d + n); });
  return out;
}

frame_reader protected_reader(const frame_key& k, bool confidential) {
  auto r = make_reader();
  r.allow(kind_bit(frame_kind::message) | kind_bit(frame_kind::heartbeat) | kind_bit(frame_kind::goodbye));
  r.protect(std::make_unique<frame_cipher>(k, frame_cipher::direction::open, confidential));
  return r;
}

} // namespace

TEST_CASE("protected frames: sealed and opened whole, in pieces, integrity only and confidential", "[net][frame]") {
  for (bool confidential : {false, true}) {
    frame_cipher seal(key_of(1), frame_cipher::direction::seal, confidential);
    bytes stream;
    const std::size_t sizes[] = {64, 4096, 1 << 20};
    for (std::size_t i = 0; i < 3; ++i) {
      auto m = tensor_message(from, to, sizes[i], uint32_t(i));
      auto wire = sealed_on_wire(make_message_frame(to, m, i + 1), seal);
      CHECK(wire.size() == make_message_frame(to, m, i + 1).bytes() + frame_tag_bytes);
      // Confidential: the payload's bytes are not on the wire as they are.
      const auto plain = on_wire(make_message_frame(to, m, i + 1));
      const bool same_payload =
          std::equal(plain.begin() + plain.size() / 2, plain.end(), wire.begin() + plain.size() / 2);
      CHECK(same_payload == !confidential);
      stream.insert(stream.end(), wire.begin(), wire.end());
    }
    auto hb = sealed_on_wire(make_control_frame(frame_kind::heartbeat, nullptr, 0, 7), seal);
    stream.insert(stream.end(), hb.begin(), hb.end());
    for (std::size_t chunk : {std::size_t(13), std::size_t(1) << 20}) {
      auto r = protected_reader(key_of(1), confidential);
      auto frames = feed(r, stream, chunk);
      REQUIRE(frames.size() == 4);
      for (std::size_t i = 0; i < 3; ++i) {
        CHECK(frames[i].source == from);
        CHECK(tensor_message_intact(frames[i].msg, sizes[i]));
      }
      CHECK(frames[3].header.kind == frame_kind::heartbeat);
      CHECK(frames[3].header.ack == 7);
    }
  }
}

TEST_CASE("protected frames: the tag is RFC 8439's ChaCha20-Poly1305 (AES-256-GCM when encrypted), as protocol.md says",
          "[net][frame]") {
  // The wire format pinned: frame number 0 of a link is nonce 0; the header and the segment
  // table are additional data, then the payload (additional data too, or encrypted).
  for (bool confidential : {false, true}) {
    frame_cipher seal(key_of(1), frame_cipher::direction::seal, confidential);
    auto m = tensor_message(from, to, 4096, 5);
    const out_frame f = make_message_frame(to, m, 1);
    const bytes plain = on_wire(f), wire = sealed_on_wire(f, seal);
    std::size_t payload = 0;
    for (auto& seg : f.segments) payload += seg.size() * sizeof(capnp::word);
    const std::size_t head = plain.size() - payload;
    const frame_key k = key_of(1);
    const unsigned char iv[12] = {};
    EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
    REQUIRE(ctx);
    const EVP_CIPHER* aead = confidential ? EVP_aes_256_gcm() : EVP_chacha20_poly1305();
    bytes expected(plain.size());
    unsigned char tag[16], rest[16];
    int n = 0;
    const auto* in = reinterpret_cast<const unsigned char*>(plain.data());
    auto* out = reinterpret_cast<unsigned char*>(expected.data());
    std::memcpy(out, in, head);
    bool ok = EVP_EncryptInit_ex(ctx, aead, nullptr, k.data(), iv) == 1 &&
              EVP_EncryptUpdate(ctx, nullptr, &n, in, int(head)) == 1;
    if (confidential) ok = ok && EVP_EncryptUpdate(ctx, out + head, &n, in + head, int(payload)) == 1;
    else {
      ok = ok && EVP_EncryptUpdate(ctx, nullptr, &n, in + head, int(payload)) == 1;
      std::memcpy(out + head, in + head, payload);
    }
    ok = ok && EVP_EncryptFinal_ex(ctx, rest, &n) == 1 && EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, 16, tag) == 1;
    EVP_CIPHER_CTX_free(ctx);
    REQUIRE(ok);
    REQUIRE(wire.size() == plain.size() + frame_tag_bytes);
    CHECK(std::equal(expected.begin(), expected.end(), wire.begin()));
    CHECK(std::memcmp(tag, wire.data() + plain.size(), 16) == 0);
  }
}

TEST_CASE("protected frames: a flipped bit anywhere, a replay, a dropped frame or another key fail the tag",
          "[net][frame]") {
  for (bool confidential : {false, true}) {
    frame_cipher seal(key_of(1), frame_cipher::direction::seal, confidential);
    auto m = tensor_message(from, to, 4096, 3);
    const bytes first = sealed_on_wire(make_message_frame(to, m, 1), seal);
    const bytes second = sealed_on_wire(make_message_frame(to, m, 2), seal);
    auto fails = [&](const bytes& in, const frame_key& k = key_of(1)) {
      auto r = protected_reader(k, confidential);
      try {
        auto frames = feed(r, in, in.size());
        return false;
      } catch (const frame_exception& e) {
        return e.reason() == frame_error::bad_tag;
      }
    };
    CHECK_FALSE(fails(first));
    bytes both = first;
    both.insert(both.end(), second.begin(), second.end());
    CHECK_FALSE(fails(both));
    // A bit of the acknowledgement (header), of the segment table's padding-free payload, of the tag.
    for (std::size_t at : {std::size_t(24), frame_header_bytes + 8 + 100, first.size() / 2, first.size() - 1}) {
      bytes altered = first;
      altered[at] ^= std::byte{0x10};
      CHECK(fails(altered));
    }
    bytes replayed = first;
    replayed.insert(replayed.end(), first.begin(), first.end());
    CHECK(fails(replayed));    // the same frame twice: the second is frame 1 of the link, sealed as frame 0
    CHECK(fails(second));      // frame 0 missing
    CHECK(fails(first, key_of(2)));
  }
}

TEST_CASE("frames: a body gets buffer as its bytes arrive, at once up to the largest frame the stream completed",
          "[net][frame]") {
  auto r = make_reader();
  // A header and table claiming 512 MiB, then 1 MiB of it: no more than the initial grant is held.
  out_frame big = make_message_frame(to, tensor_message(from, to, 64, 1), 1);
  bytes head(big.head.begin(), big.head.end());
  const uint64_t claimed = uint64_t(512) << 20;
  put<uint64_t>(head, 32, segment_table_bytes(1) + claimed);
  put<uint32_t>(head, frame_header_bytes, static_cast<uint32_t>(claimed / 8));
  bytes some(head);
  some.resize(head.size() + (1 << 20), std::byte{0});
  CHECK(feed(r, some, 64 << 10).empty());
  CHECK(r.frame_bytes() == frame_header_bytes + segment_table_bytes(1) + claimed);
  CHECK(r.held_bytes() <= initial_frame_grant);
  // 20 MiB in: the buffer grew as the bytes came (x4 steps), far below the claim.
  bytes more((19 << 20), std::byte{0});
  CHECK(feed(r, more, 256 << 10).empty());
  CHECK(r.held_bytes() >= (20u << 20));
  CHECK(r.held_bytes() <= (64u << 20));

  // A stream that completed a 12 MiB frame gets 12 MiB at once for the next one, and the frames are intact.
  auto r2 = make_reader();
  auto m = tensor_message(from, to, 12 << 20, 5);
  bytes two = on_wire(make_message_frame(to, m, 1));
  auto frames = feed(r2, two, 256 << 10);
  REQUIRE(frames.size() == 1);
  CHECK(tensor_message_intact(frames[0].msg, 12 << 20));
  bytes part(two.begin(), two.begin() + frame_header_bytes + 8 + 100);
  CHECK(feed(r2, part, part.size()).empty());
  CHECK(r2.held_bytes() >= (12u << 20));
}

TEST_CASE("frames: a message_ref carries its message frame's header and table and its reference, nothing else",
          "[net][frame][lane]") {
  const out_frame m = make_message_frame(to, tensor_message(from, to, 4096, 1), 9);
  const out_frame r = make_message_ref_frame(m, {7, 4096, m.plain_bytes() - m.head.size()});
  CHECK(r.segments.empty());
  CHECK(r.head.size() == m.head.size() + message_ref_bytes);
  auto reader = make_reader();
  auto frames = feed(reader, on_wire(r), 5);  // a few bytes per read
  REQUIRE(frames.size() == 1);
  const in_frame& f = frames[0];
  CHECK(f.header.kind == frame_kind::message_ref);
  CHECK(f.header.sequence == 9);
  CHECK(f.header.destination == to);
  CHECK(f.msg.empty());
  REQUIRE(f.sizes.size() == m.segments.size());
  for (std::size_t i = 0; i < f.sizes.size(); ++i) CHECK(f.sizes[i] == m.segments[i].size());
  const message_ref got = decode_message_ref(f.body);
  CHECK(got.lane == 7);
  CHECK(got.offset == 4096);
  CHECK(got.bytes == m.plain_bytes() - m.head.size());
  // A body that is not the table and the 24-byte reference is refused before it is read.
  bytes b = on_wire(r);
  put<uint64_t>(b, 32, b.size() - frame_header_bytes + 8);
  CHECK(error_of(b) == frame_error::bad_length);
  CHECK_THROWS_AS(make_message_ref_frame(r, {7, 4096, 8}), error);  // only from a message frame
}
