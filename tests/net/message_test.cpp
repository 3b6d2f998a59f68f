// Messages: addressed envelopes, zero-copy reads of valid messages, parameter
// ranges as one flat payload; malformed, oversized, wrong-shape and NaN
// messages rejected with a countable reason.
#include <capnp/serialize.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "net/message.hpp"
#include "net/tensor_codec.hpp"

using namespace troupe;
using namespace troupe::net;
using Catch::Contains;

namespace {

const address worker3{0, role::worker, 3};
const address shard0{1, role::shard, 0};

/// A PushGradient from worker 3 to shard 0: the range (first, offset) of `ts`, one payload.
message push_gradient(const std::vector<tensor>& ts, uint16_t version = wire::SCHEMA_VERSION, uint32_t first = 0,
                      int64_t offset = 0) {
  auto b = make_builder();
  auto env = init_envelope(*b, worker3, shard0);
  env.setSchemaVersion(version);
  auto p = env.initPushGradient();
  p.setShard(0);
  p.setBaseVersion(41);
  p.setStep(42);
  std::vector<shape> shapes;
  for (const auto& t : ts) shapes.push_back(t.shape());
  float* dst = init_flat(p.initValues(), first, offset, shapes);
  for (const auto& t : ts) {
    std::copy(t.data(), t.data() + t.numel(), dst);
    dst += t.numel();
  }
  return message::from_builder(std::move(b));
}

std::vector<uint8_t> flat_bytes(const message& m) {
  kj::Array<capnp::word> words = capnp::messageToFlatArray(m.segments());
  auto bytes = words.asBytes();
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

reject_reason reason_of(const message& m, const reader_limits& l = {}) {
  try {
    envelope_reader r(m, l);
  } catch (const message_error& e) {
    return e.reason();
  }
  FAIL("message was accepted");
  return reject_reason::malformed;
}

bool inside(const message& m, const void* p) {
  bool in = false;
  for (auto seg : m.segments()) {
    auto* lo = reinterpret_cast<const char*>(seg.begin());
    auto* hi = reinterpret_cast<const char*>(seg.end());
    in |= reinterpret_cast<const char*>(p) >= lo && reinterpret_cast<const char*>(p) < hi;
  }
  return in;
}

} // namespace

TEST_CASE("addresses: order, names, hashes and the wire round trip", "[net][message]") {
  CHECK(to_string(worker3) == "worker 3 on node 0");
  CHECK(to_string(coordinator_address(2)) == "coordinator 0 on node 2");
  CHECK(std::string(to_string(role::evaluator)) == "evaluator");
  CHECK(worker3 != shard0);
  CHECK(worker3 < shard0);  // node first
  CHECK(address{0, role::loader, 9} < address{0, role::worker, 0});  // then role
  CHECK(address{0, role::worker, 1} < address{0, role::worker, 2});  // then index
  CHECK(std::hash<address>{}(address{0, role::worker, 1}) != std::hash<address>{}(address{0, role::shard, 1}));
  CHECK(std::hash<address>{}(address{0, role::worker, 1}) != std::hash<address>{}(address{1, role::worker, 1}));
  capnp::MallocMessageBuilder b;
  auto a = b.initRoot<wire::Address>();
  for (const address& x : {worker3, shard0, address{7, role::evaluator, 0}, address{4, role::stage, 12}}) {
    write_address(a, x);
    CHECK(read_address(a.asReader()) == x);
  }
  // A role this build does not know is malformed.
  a.setRole(static_cast<wire::Role>(9));
  CHECK_THROWS_AS(read_address(a.asReader()), message_error);
}

TEST_CASE("a valid message is read in place, without copying its payload", "[net][message]") {
  tensor g = tensor::from({2, 3}, {1, 2, 3, 4, 5, 6});
  message m = push_gradient({g, tensor::from({3}, {7, 8, 9})}, wire::SCHEMA_VERSION, 4, 10);
  message shared = m;  // a second receiver: same buffer
  envelope_reader r(shared);
  CHECK(read_address(r.root().getSource()) == worker3);
  CHECK(read_address(r.root().getDestination()) == shard0);
  auto p = r.root().getPushGradient();
  CHECK(p.getBaseVersion() == 41);
  CHECK(p.getStep() == 42);
  flat_view v = view(p.getValues(), "g");
  CHECK(v.first == 4u);
  CHECK(v.offset == 10);
  REQUIRE(v.shapes.size() == 2);
  CHECK(v.shapes[0] == shape{2, 3});
  CHECK(v.shapes[1] == shape{3});
  CHECK(v.numel == 9);
  CHECK(v.data[5] == 6.0f);
  CHECK(v.data[8] == 9.0f);
  // The view points into the message's own segments.
  CHECK(inside(m, v.data));
  CHECK(inside(m, v.data + 8));
  CHECK_NOTHROW(require_range(v, 4, 10, {{2, 3}, {3}}, "push"));
  CHECK_THROWS_WITH(require_range(v, 4, 10, {{3, 2}, {3}}, "push"), Contains("expected [3, 2]"));
  CHECK_THROWS_WITH(require_range(v, 4, 10, {{2, 3}}, "push"), Contains("expected tensors [4, 5) at offset 10"));
  CHECK_THROWS_WITH(require_range(v, 3, 10, {{2, 3}, {3}}, "push"), Contains("tensors [4, 6) at offset 10"));
  CHECK_THROWS_WITH(require_range(v, 4, 0, {{2, 3}, {3}}, "push"), Contains("expected tensors [4, 6) at offset 0"));
  try {
    require_range(v, 4, 10, {{2, 3}, {4}}, "push");
    FAIL("accepted");
  } catch (const message_error& e) {
    CHECK(e.reason() == reject_reason::wrong_shape);
    CHECK_THAT(std::string(e.what()), Contains("tensor 5 has shape [3]"));
  }
}

TEST_CASE("read_header reads kind and addresses without validating the payload", "[net][message]") {
  tensor g = tensor::full({4}, 1.0f);
  g.at(2) = std::nanf("");
  message m = push_gradient({g});
  const header h = read_header(m);
  CHECK(h.kind == wire::Envelope::PUSH_GRADIENT);
  CHECK(h.source == worker3);
  CHECK(h.destination == shard0);
  CHECK(reason_of(m) == reject_reason::non_finite);  // the full reader does
  // Headers that cannot be read.
  try {
    read_header(push_gradient({g}, 99));
    FAIL("accepted");
  } catch (const message_error& e) {
    CHECK(e.reason() == reject_reason::unknown_version);
  }
  std::vector<uint8_t> junk(64, 0xff);
  CHECK_THROWS_AS(read_header(message::from_bytes(junk.data(), junk.size())), message_error);
  CHECK_THROWS_AS(read_header(message()), message_error);
  // An envelope whose source names an unknown role.
  auto b = make_builder();
  auto env = init_envelope(*b, worker3, shard0);
  env.getSource().setRole(static_cast<wire::Role>(42));
  env.initControl();
  message bad_role = message::from_builder(std::move(b));
  CHECK_THROWS_AS(read_header(bad_role), message_error);
  CHECK(reason_of(bad_role) == reject_reason::malformed);
}

TEST_CASE("bytes from the wire round-trip through from_bytes", "[net][message]") {
  message m = push_gradient({tensor::from({2}, {1.5f, -2.5f})});
  auto bytes = flat_bytes(m);
  message back = message::from_bytes(bytes.data(), bytes.size());
  CHECK(back.framed());
  CHECK_FALSE(m.framed());
  envelope_reader r(back);
  CHECK(view(r.root().getPushGradient().getValues(), "g").data[1] == -2.5f);
  CHECK(read_header(back).source == worker3);
}

TEST_CASE("malformed, oversized, unknown-version, bad and non-finite messages are rejected", "[net][message]") {
  reject_counter counter;
  auto feed = [&](const message& m, const reader_limits& l = {}) {
    reject_reason r = reason_of(m, l);
    counter.count(r);
    return r;
  };

  SECTION("random bytes and truncations") {
    std::mt19937 rng(5);
    for (int i = 0; i < 50; ++i) {
      std::vector<uint8_t> junk(8 + rng() % 200);
      for (auto& b : junk) b = static_cast<uint8_t>(rng());
      try {
        envelope_reader r(message::from_bytes(junk.data(), junk.size()));
      } catch (const message_error& e) {
        counter.count(e.reason());
      }
    }
    CHECK(counter.total() >= 45);
    auto bytes = flat_bytes(push_gradient({tensor::full({64}, 1.0f)}));
    for (std::size_t cut : {std::size_t(4), std::size_t(16), bytes.size() / 2, bytes.size() - 8}) {
      CHECK(feed(message::from_bytes(bytes.data(), cut)) == reject_reason::malformed);
    }
    CHECK(feed(message()) == reject_reason::malformed);
  }
  SECTION("oversized") {
    message m = push_gradient({tensor::full({1024}, 1.0f)});
    reader_limits small;
    small.max_bytes = 1024;
    CHECK(feed(m, small) == reject_reason::too_large);
    CHECK(counter.get(reject_reason::too_large) == 1u);
  }
  SECTION("unknown schema version") {
    CHECK(feed(push_gradient({tensor::full({2}, 1.0f)}, 99)) == reject_reason::unknown_version);
    CHECK(feed(push_gradient({tensor::full({2}, 1.0f)}, 1)) == reject_reason::unknown_version);
  }
  SECTION("a tensor payload that does not match its shape") {
    auto b = make_builder();
    auto t = init_envelope(*b, worker3, shard0).initActivation().initTensor();
    auto dims = t.initShape(2);
    dims.set(0, 4);
    dims.set(1, 4);
    t.initData(12);
    CHECK(feed(message::from_builder(std::move(b))) == reject_reason::bad_tensor);
  }
  SECTION("a flat payload that does not match its shapes, or a negative dimension") {
    auto build = [](int64_t dim, unsigned bytes) {
      auto b = make_builder();
      auto v = init_envelope(*b, worker3, shard0).initPushGradient().initValues();
      auto shapes = v.initShapes(2);
      shapes[0].initDims(1).set(0, 3);
      shapes[1].initDims(1).set(0, dim);
      v.initPayload(bytes);
      return message::from_builder(std::move(b));
    };
    CHECK(feed(build(2, 4 * sizeof(float))) == reject_reason::bad_tensor);
    CHECK(feed(build(-1, 0)) == reject_reason::bad_tensor);
    CHECK(feed(build(2, 6 * sizeof(float))) == reject_reason::bad_tensor);
    CHECK_NOTHROW(envelope_reader(build(2, 5 * sizeof(float))));  // 3 + 2 zeros: fits
  }
  SECTION("NaN and Inf, scanned by one thread or several") {
    tensor g = tensor::full({8}, 1.0f);
    g.at(3) = std::nanf("");
    CHECK(feed(push_gradient({g})) == reject_reason::non_finite);
    g.at(3) = -INFINITY;
    CHECK(feed(push_gradient({g})) == reject_reason::non_finite);
    reader_limits lax;
    lax.check_finite = false;
    CHECK_NOTHROW(envelope_reader(push_gradient({g}), lax));
    // A payload large enough to be split between threads, bad only in its last element.
    tensor big = tensor::full({100000}, 0.5f);
    big.at(99999) = INFINITY;
    // The reader's own loop, and a receiver's scan (kernels::all_finite in the actors), called once per tensor.
    reader_limits l;
    CHECK(feed(push_gradient({big}), l) == reject_reason::non_finite);
    int scans = 0;
    l.finite_scan = [](const void* c, const float* data, int64_t n) {
      ++*static_cast<int*>(const_cast<void*>(c));
      for (int64_t i = 0; i < n; ++i)
        if (!std::isfinite(data[i])) return false;
      return true;
    };
    l.scan_context = &scans;
    CHECK(feed(push_gradient({big}), l) == reject_reason::non_finite);
    CHECK(scans == 1);
    big.at(99999) = 0.5f;
    CHECK_NOTHROW(envelope_reader(push_gradient({big}), l));
    CHECK(scans == 2);
    big.at(99999) = INFINITY;
  }
  SECTION("batch labels that do not match the images") {
    auto b = make_builder();
    auto batch = init_envelope(*b, address{0, role::loader, 0}, worker3).initBatch();
    encode(tensor::zeros({4, 1, 2, 2}), batch.initImages());
    batch.initLabels(3);
    CHECK(feed(message::from_builder(std::move(b))) == reject_reason::wrong_shape);
  }
  // After every rejection, a valid message is still served.
  CHECK_NOTHROW(envelope_reader(push_gradient({tensor::full({2}, 1.0f)})));
}

TEST_CASE("peer limits admit larger messages than the defaults and keep the NaN scan", "[net][message]") {
  const reader_limits def;
  const reader_limits peer = peer_limits();
  CHECK(peer.max_bytes > def.max_bytes);
  CHECK(peer.max_bytes == uint64_t(1) << 30);
  CHECK(peer.check_finite);
  CHECK(def.finite_scan == nullptr);
}

TEST_CASE("a message can be changed in place only while it has one holder", "[net][message]") {
  message m = push_gradient({tensor::from({2}, {1, 2})});
  REQUIRE(m.exclusive_builder() != nullptr);
  message other = m;
  CHECK(m.exclusive_builder() == nullptr);
  CHECK(other.exclusive_builder() == nullptr);
  other = message();
  auto* b = m.exclusive_builder();
  REQUIRE(b != nullptr);
  auto env = b->getRoot<wire::Envelope>();
  env.getPushGradient().setBaseVersion(7);
  write_address(env.getDestination(), address{2, role::shard, 5});
  payload(env.getPushGradient().getValues())[1] = 20;
  envelope_reader r(m);
  CHECK(r.root().getPushGradient().getBaseVersion() == 7u);
  CHECK(read_header(m).destination == address{2, role::shard, 5});
  CHECK(view(r.root().getPushGradient().getValues(), "g").data[1] == 20.0f);
  // Bytes from outside and an empty message have no builder.
  CHECK(message::from_bytes(flat_bytes(m).data(), flat_bytes(m).size()).exclusive_builder() == nullptr);
  CHECK(message().exclusive_builder() == nullptr);
}

TEST_CASE("init_flat lays a range out as one payload, payload finds it again", "[net][message]") {
  auto b = make_builder(13 * sizeof(float));
  auto p = init_envelope(*b, worker3, shard0).initPushGradient();
  const std::vector<shape> shapes{{2, 3}, {4}, {0}, {3}};
  float* flat = init_flat(p.initValues(), 2, 100, shapes);
  REQUIRE(flat == payload(p.getValues()));
  for (int i = 0; i < 13; ++i) CHECK(flat[i] == 0.0f);  // zeroed
  for (int i = 0; i < 13; ++i) flat[i] = static_cast<float>(i);
  message m = message::from_builder(std::move(b));
  CHECK(m.segments().size() == 1);  // make_builder sized it: one segment
  envelope_reader r(m);
  flat_view v = view(r.root().getPushGradient().getValues(), "test");
  CHECK(v.data == flat);
  CHECK(v.first == 2u);
  CHECK(v.offset == 100);
  CHECK(v.numel == 13);
  CHECK(v.shapes == shapes);
  CHECK(v.data[6] == 6.0f);   // tensor 1 starts after the 6 of tensor 0
  CHECK(v.data[10] == 10.0f); // tensor 3 after the empty tensor 2
  // One Cap'n Proto blob holds fewer than 2^29 bytes: the range is refused before it is allocated.
  auto big = make_builder();
  auto pb = init_envelope(*big, worker3, shard0).initPushGradient();
  CHECK_THROWS_WITH(init_flat(pb.initValues(), 0, 0, {{int64_t(1) << 27}}), Contains("use more shards"));
}

TEST_CASE("a payload its producer writes whole goes outside the builder's segments when large", "[net][message]") {
  // Large: init_flat's and init_tensor's payload is an external blob, the message's second segment, whole words.
  const int64_t n = int64_t(pooled_payload_bytes / sizeof(float)) + 1;
  for (const bool flat : {true, false}) {
    auto b = make_builder();
    auto env = init_envelope(*b, shard0, worker3);
    std::shared_ptr<const void> keep;
    float* data = flat ? init_flat(*b, env.initParams().initValues(), 0, 0, {{n}}, keep)
                       : init_tensor(*b, shape{1, n}, env.initBatch().initImages(), keep);
    REQUIRE(keep);
    for (int64_t i = 0; i < n; ++i) data[i] = static_cast<float>(i % 97) - 3.0f;
    if (!flat) env.getBatch().initLabels(1).set(0, 4);
    message m = message::from_builder(std::move(b), std::move(keep));
    REQUIRE(m.segments().size() == 2);
    CHECK(reinterpret_cast<const float*>(m.segments()[1].begin()) == data);
    CHECK(m.segments()[1].size() == static_cast<std::size_t>(n * 4 + 7) / 8);
    CHECK(reinterpret_cast<const float*>(m.segments()[1].begin())[n] == 0.0f);  // the padding
    const auto bytes = flat_bytes(m);  // as a frame carries it
    message copy = message::from_bytes(bytes.data(), bytes.size());
    envelope_reader r(copy);
    const float* got = flat ? view(r.root().getParams().getValues(), "test").data
                            : view(r.root().getBatch().getImages(), "test").data;
    CHECK(got[0] == -3.0f);
    CHECK(got[n - 1] == static_cast<float>((n - 1) % 97) - 3.0f);
  }
  // Small: inside the builder, one segment, nothing kept.
  auto b = make_builder(64);
  std::shared_ptr<const void> keep;
  init_flat(*b, init_envelope(*b, shard0, worker3).initParams().initValues(), 0, 0, {{4}}, keep);
  CHECK_FALSE(keep);
  CHECK(message::from_builder(std::move(b)).segments().size() == 1);
}

TEST_CASE("large messages are built in first segments that are reused, and zero again each time", "[net][message]") {
  const int64_t n = int64_t(pooled_payload_bytes / sizeof(float)) + 100;
  const void* first = nullptr;
  for (int i = 0; i < 3; ++i) {
    // Each round lays out a smaller range than the one before, over the bytes
    // the earlier message wrote: Cap'n Proto reads unset fields as zero, so
    // the reused segment must be zero again.
    auto b = make_builder(static_cast<std::size_t>(n) * sizeof(float));
    auto p = init_envelope(*b, worker3, shard0).initPushGradient();
    const int64_t count = n - 1000 * i;
    float* flat = init_flat(p.initValues(), 0, 0, {{count}});
    int64_t nonzero = 0;
    for (int64_t k = 0; k < count; ++k) nonzero += flat[k] != 0.0f;
    CHECK(nonzero == 0);
    std::fill(flat, flat + count, 1.5f + static_cast<float>(i));
    if (i == 1) p.setStep(77);
    message m = message::from_builder(std::move(b));
    CHECK(m.segments().size() == 1);
    if (i == 0) first = m.segments()[0].begin();
    CHECK(m.segments()[0].begin() == first);  // the same buffer, back from the pool
    envelope_reader r(m);
    CHECK(r.root().getPushGradient().getStep() == (i == 1 ? 77u : 0u));
    flat_view v = view(r.root().getPushGradient().getValues(), "test");
    CHECK(v.numel == count);
    CHECK(v.data[count - 1] == 1.5f + static_cast<float>(i));
  }
}
