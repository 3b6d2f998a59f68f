// libFuzzer target: the frame reader (net/frame.hpp), the envelope reader
// (net::envelope_reader), what the roles read of each kind (tensors viewed,
// ranges checked, the protocol table) and the handshake decoders
// (net/auth.hpp) on arbitrary bytes. Built and run by scripts/fuzz.sh (clang++
// -fsanitize=fuzzer,address); CTest runs it for a bounded time.
//
// The first input byte steers: bit 0 wraps the rest in a valid frame header
// and segment table (so that most inputs reach the envelope reader), bits 1-2
// pick the kinds the reader allows, the others how the stream is cut into reads.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "net/auth.hpp"
#include "net/frame.hpp"
#include "net/protocol.hpp"
#include "net/tensor_codec.hpp"

using namespace troupe::net;

namespace {

std::vector<std::byte> wrapped(const uint8_t* data, std::size_t size) {
  // Segments: a count from the first byte, sizes cut from the rest, each at least one word.
  const uint32_t want = size ? 1 + data[0] % 4 : 1;
  std::vector<uint8_t> body(data + (size ? 1 : 0), data + size);
  body.resize(std::max<std::size_t>(8 * want, (body.size() + 7) / 8 * 8), 0);
  const uint32_t words = static_cast<uint32_t>(body.size() / 8);
  std::vector<uint32_t> sizes;
  uint32_t left = words;
  for (uint32_t i = 0; i + 1 < want; ++i) {
    const uint32_t s = 1 + (body[i] % std::max<uint32_t>(1, left - (want - i - 1)));
    sizes.push_back(std::min(s, left - (want - i - 1)));
    left -= sizes.back();
  }
  sizes.push_back(left);
  frame_header h;
  h.kind = frame_kind::message;
  h.segments = static_cast<uint32_t>(sizes.size());
  h.sequence = 1;
  h.destination = {1, role::worker, 2};
  const std::size_t table = segment_table_bytes(h.segments);
  h.body_bytes = table + body.size();
  std::vector<std::byte> out(frame_header_bytes + table);
  encode_header(h, out.data());
  std::memcpy(out.data() + frame_header_bytes, sizes.data(), 4 * sizes.size());
  auto* b = reinterpret_cast<const std::byte*>(body.data());
  out.insert(out.end(), b, b + body.size());
  return out;
}

/// What the roles read of each kind: tensors viewed in place, ranges checked
/// against a layout of two tensors ([2, 3] at 0, [2] at 6), lists read.
void read_fields(troupe::wire::Envelope::Reader root) {
  using troupe::wire::Envelope;
  const std::vector<troupe::shape> layout{troupe::shape({2, 3}), troupe::shape({2})};
  auto flat = [&](troupe::wire::FlatTensors::Reader f) {
    const flat_view v = view(f, "range");
    float sum = 0;
    for (int64_t i = 0; i < v.numel; ++i) sum += v.data[i];  // every element is inside the frame
    (void)sum;
    require_range(v, 0, 0, layout, "range");
  };
  switch (root.which()) {
    case Envelope::BATCH: {
      const tensor_view t = view(root.getBatch().getImages(), "images");
      if (t.numel() > 0) (void)(t.data[0] + t.data[t.numel() - 1]);
      (void)root.getBatch().getLabels().size();
      break;
    }
    case Envelope::PARAMS:
      flat(root.getParams().getValues());
      (void)decode(root.getParams().getRuleState(), "rule state");
      break;
    case Envelope::PUSH_GRADIENT: flat(root.getPushGradient().getValues()); break;
    case Envelope::ACTIVATION: (void)view(root.getActivation().getTensor(), "activation"); break;
    case Envelope::GRADIENT: (void)view(root.getGradient().getTensor(), "gradient"); break;
    case Envelope::CONTROL: (void)root.getControl().getDetail().size(); break;
    case Envelope::COLLECTIVE: (void)root.getCollective().getPayload().size(); break;
    case Envelope::REGROUP: (void)root.getRegroup().getMembers().size(); break;
    default: break;
  }
}

void open_envelope(const message& m) {
  reader_limits limits;
  limits.max_bytes = 1 << 20;
  try {
    envelope_reader r(m, limits);
    (void)read_header(m);
    for (auto role : {troupe::wire::Role::WORKER, troupe::wire::Role::SHARD, troupe::wire::Role::STAGE})
      try {
        require_accepted(role, r, "fuzz");
      } catch (const message_error&) {
      }
    read_fields(r.root());
  } catch (const message_error&) {
  }
}

void open_handshake(const in_frame& f) {
  auth_identity me;
  me.secret = "fuzz";
  me.schema = 2;
  try {
    if (f.header.kind == frame_kind::hello) {
      me.node = 0;
      acceptor_handshake a(me, 4);
      a.on_hello(f.body);
      (void)a.challenge({1, 2, 3, 4});
      a.on_proof(f.body);
    } else if (f.header.kind == frame_kind::challenge) {
      me.node = 1;
      dialer_handshake d(me, 0, {1, 2, 0, 0});
      (void)d.on_challenge(f.body);
    }
  } catch (const auth_failure&) {
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  static auto pool = buffer_pool::create(16 << 20);
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  std::vector<std::byte> stream;
  if (mode & 1) {
    stream = wrapped(data + 1, size - 1);
  } else {
    auto* b = reinterpret_cast<const std::byte*>(data + 1);
    stream.assign(b, b + size - 1);
  }
  frame_reader r(1 << 20, pool, 4096);
  switch ((mode >> 1) & 3) {
    case 0: break;  // every kind
    case 1: r.allow(kind_bit(frame_kind::message) | kind_bit(frame_kind::heartbeat) | kind_bit(frame_kind::goodbye)); break;
    case 2: r.allow(kind_bit(frame_kind::hello)); break;
    default: r.allow(kind_bit(frame_kind::challenge) | kind_bit(frame_kind::refuse)); break;
  }
  const std::size_t chunk = 1 + (std::size_t(mode >> 3) * 997) % 5000;
  std::size_t at = 0;
  in_frame f;
  for (;;) {
    try {
      while (r.next(f)) {
        if (!f.msg.empty()) open_envelope(f.msg);
        if (!f.body.empty()) open_handshake(f);
      }
    } catch (const frame_exception& e) {
      if (e.fatal()) return 0;
      continue;
    }
    if (at == stream.size()) return 0;
    auto buf = r.next_buffer();
    const std::size_t n = std::min({buf.size(), chunk, stream.size() - at});
    std::memcpy(buf.begin(), stream.data() + at, n);
    r.commit(n);
    at += n;
  }
}
