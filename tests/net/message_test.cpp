// Messages: zero-copy reads of valid messages; malformed, oversized,
// wrong-shape and NaN messages rejected with a countable reason.
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

message push_gradient(const std::vector<tensor>& ts, uint16_t version = wire::SCHEMA_VERSION) {
  auto b = std::make_unique<capnp::MallocMessageBuilder>();
  auto env = b->initRoot<wire::Envelope>();
  env.setSchemaVersion(version);
  env.setSender(3);
  auto p = env.initPushGradient();
  p.setWorker(3);
  p.setBaseVersion(41);
  auto list = p.initTensors(static_cast<unsigned>(ts.size()));
  for (unsigned i = 0; i < ts.size(); ++i) encode(ts[i], list[i]);
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

} // namespace

TEST_CASE("a valid message is read in place, without copying tensor payloads", "[net][message]") {
  tensor g = tensor::from({2, 3}, {1, 2, 3, 4, 5, 6});
  message m = push_gradient({g, tensor::from({3}, {7, 8, 9})});
  message shared = m;  // a second receiver: same buffer
  envelope_reader r(shared);
  auto p = r.root().getPushGradient();
  CHECK(p.getWorker() == 3);
  CHECK(p.getBaseVersion() == 41);
  tensor_view v = view(p.getTensors()[0], "g");
  CHECK(v.dims == shape{2, 3});
  CHECK(v.data[5] == 6.0f);
  // The view points into the message's own segments.
  bool inside = false;
  for (auto seg : m.segments()) {
    auto* lo = reinterpret_cast<const char*>(seg.begin());
    auto* hi = reinterpret_cast<const char*>(seg.end());
    inside |= reinterpret_cast<const char*>(v.data) >= lo && reinterpret_cast<const char*>(v.data) < hi;
  }
  CHECK(inside);
  CHECK_NOTHROW(require_shapes(p.getTensors(), {{2, 3}, {3}}, "push"));
  CHECK_THROWS_WITH(require_shapes(p.getTensors(), {{3, 2}, {3}}, "push"), Contains("expected [3, 2]"));
}

TEST_CASE("bytes from the wire round-trip through from_bytes", "[net][message]") {
  message m = push_gradient({tensor::from({2}, {1.5f, -2.5f})});
  auto bytes = flat_bytes(m);
  message back = message::from_bytes(bytes.data(), bytes.size());
  envelope_reader r(back);
  CHECK(view(r.root().getPushGradient().getTensors()[0], "g").data[1] == -2.5f);
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
    CHECK(counter.total() >= 45);  // a few random buffers may parse as an empty envelope of version 0... and fail on version
    auto bytes = flat_bytes(push_gradient({tensor::full({64}, 1.0f)}));
    for (std::size_t cut : {std::size_t(4), std::size_t(16), bytes.size() / 2, bytes.size() - 8}) {
      CHECK(feed(message::from_bytes(bytes.data(), cut)) == reject_reason::malformed);
    }
  }
  SECTION("oversized") {
    message m = push_gradient({tensor::full({1024}, 1.0f)});
    reader_limits small;
    small.max_bytes = 1024;
    CHECK(feed(m, small) == reject_reason::too_large);
  }
  SECTION("unknown schema version") {
    CHECK(feed(push_gradient({tensor::full({2}, 1.0f)}, 99)) == reject_reason::unknown_version);
  }
  SECTION("payload that does not match its shape") {
    auto b = std::make_unique<capnp::MallocMessageBuilder>();
    auto env = b->initRoot<wire::Envelope>();
    env.setSchemaVersion(wire::SCHEMA_VERSION);
    auto t = env.initActivation().initTensor();
    auto dims = t.initShape(2);
    dims.set(0, 4);
    dims.set(1, 4);
    t.initData(12);
    CHECK(feed(message::from_builder(std::move(b))) == reject_reason::bad_tensor);
  }
  SECTION("NaN and Inf") {
    tensor g = tensor::full({8}, 1.0f);
    g.at(3) = std::nanf("");
    CHECK(feed(push_gradient({g})) == reject_reason::non_finite);
    g.at(3) = -INFINITY;
    CHECK(feed(push_gradient({g})) == reject_reason::non_finite);
    reader_limits lax;
    lax.check_finite = false;
    CHECK_NOTHROW(envelope_reader(push_gradient({g}), lax));
  }
  SECTION("batch labels that do not match the images") {
    auto b = std::make_unique<capnp::MallocMessageBuilder>();
    auto env = b->initRoot<wire::Envelope>();
    env.setSchemaVersion(wire::SCHEMA_VERSION);
    auto batch = env.initBatch();
    encode(tensor::zeros({4, 1, 2, 2}), batch.initImages());
    batch.initLabels(3);
    CHECK(feed(message::from_builder(std::move(b))) == reject_reason::wrong_shape);
  }
  // After every rejection, a valid message is still served.
  CHECK_NOTHROW(envelope_reader(push_gradient({tensor::full({2}, 1.0f)})));
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
  b->getRoot<wire::Envelope>().getPushGradient().setBaseVersion(7);
  CHECK(envelope_reader(m).root().getPushGradient().getBaseVersion() == 7u);
  // Bytes from outside and an empty message have no builder.
  CHECK(message::from_bytes(flat_bytes(m).data(), flat_bytes(m).size()).exclusive_builder() == nullptr);
  CHECK(message().exclusive_builder() == nullptr);
}

TEST_CASE("init_tensors lays payloads out one after another; flat_payload finds them", "[net][message]") {
  auto build = [](const std::vector<shape>& shapes, std::vector<float*>& out) {
    auto b = std::make_unique<capnp::MallocMessageBuilder>();
    auto env = b->initRoot<wire::Envelope>();
    env.setSchemaVersion(wire::SCHEMA_VERSION);
    out = init_tensors(env.initPushGradient().initTensors(static_cast<unsigned>(shapes.size())), shapes);
    return message::from_builder(std::move(b));
  };
  // Even sizes (and an odd one last): one flat array.
  const std::vector<shape> even{{2, 3}, {4}, {0}, {3}};
  std::vector<float*> ps;
  message m = build(even, ps);
  float* flat = flat_payload(ps, even);
  REQUIRE(flat == ps[0]);
  for (int i = 0; i < 13; ++i) flat[i] = static_cast<float>(i);
  envelope_reader r(m);
  auto list = r.root().getPushGradient().getTensors();
  CHECK(flat_payload(list, "test") == flat);
  CHECK(view(list[1], "test").data[0] == 6.0f);
  CHECK(view(list[3], "test").data[2] == 12.0f);
  CHECK(view(list[0], "test").dims == shape{2, 3});
  // An odd size before the end leaves a gap: no flat array, each payload stands alone.
  const std::vector<shape> odd{{3}, {2}};
  message m2 = build(odd, ps);
  CHECK(flat_payload(ps, odd) == nullptr);
  CHECK(flat_payload(envelope_reader(m2).root().getPushGradient().getTensors(), "test") == nullptr);
  // Tensors encoded one by one (shape, payload, shape, ...) are not adjacent either.
  message m3 = push_gradient({tensor::from({2}, {1, 2}), tensor::from({2}, {3, 4})});
  CHECK(flat_payload(envelope_reader(m3).root().getPushGradient().getTensors(), "test") == nullptr);
}
