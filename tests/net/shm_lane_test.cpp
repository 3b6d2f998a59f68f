#include <catch2/catch.hpp>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "net/shm_lane.hpp"
#include "tensor/error.hpp"

using namespace troupe;
using namespace troupe::net;

namespace {

bool name_exists(const std::string& name) {
  const int fd = ::shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

// Writes `value` into every word of the slot and publishes it.
void fill(lane_ring& r, const lane_ring::slot& s, uint64_t value) {
  for (std::size_t i = 0; i < s.bytes / 8; ++i) std::memcpy(s.data + 8 * i, &value, 8);
  r.publish(s);
}

} // namespace

TEST_CASE("lane: a slot published by the ring is read in place by the view, once, and released with its last holder",
          "[net][lane]") {
  auto ring = lane_ring::create(1 << 20);
  REQUIRE(ring->bytes() == std::size_t(1) << 20);
  auto offer = decode_lane_offer(encode_lane_offer(ring->offer()).data(), encode_lane_offer(ring->offer()).size());
  CHECK(offer.id == ring->id());
  CHECK(offer.bytes == ring->bytes());
  CHECK(name_exists(offer.name));
  auto view = lane_view::open(offer);
  CHECK_FALSE(name_exists(offer.name));  // nobody else can open it now

  auto s = ring->allocate(4096);
  REQUIRE(s);
  fill(*ring, *s, 0x0123456789abcdefull);
  const capnp::word* words = nullptr;
  std::string why;
  auto owner = view->take(s->offset, 4096, &words, &why);
  REQUIRE(owner);
  uint64_t first = 0;
  std::memcpy(&first, words, 8);
  CHECK(first == 0x0123456789abcdefull);
  CHECK(reinterpret_cast<uintptr_t>(words) % 8 == 0);
  // Taken once: a second reference to the same slot is refused.
  CHECK_FALSE(view->take(s->offset, 4096, &words, &why));
  CHECK_THAT(why, Catch::Matchers::Contains("taken already"));
  CHECK(ring->in_use() == 4096 + lane_slot_header_bytes);
  auto copy = owner;
  owner.reset();
  auto again = ring->allocate(8);  // reclaims nothing: the slot is still held
  REQUIRE(again);
  CHECK(ring->in_use() == 4096 + 8 + 2 * lane_slot_header_bytes);
  copy.reset();
  fill(*ring, *again, 1);
  REQUIRE(view->take(again->offset, 8, &words, &why));  // released at once (the owner is not kept)
  CHECK(ring->allocate(8));
  CHECK(ring->in_use() == 8 + lane_slot_header_bytes);  // both earlier slots reclaimed, in order
}

TEST_CASE("lane: the ring refuses what does not fit, reuses released slots in order and wraps around", "[net][lane]") {
  auto ring = lane_ring::create(64 << 10);
  auto view = lane_view::open(ring->offer());
  const std::size_t piece = (16 << 10) - lane_slot_header_bytes;  // four slots fill the region exactly
  std::vector<std::shared_ptr<const void>> held;
  std::vector<uint64_t> offsets;
  const capnp::word* words = nullptr;
  std::string why;
  for (int i = 0; i < 4; ++i) {
    auto s = ring->allocate(piece);
    REQUIRE(s);
    fill(*ring, *s, i);
    offsets.push_back(s->offset);
    held.push_back(view->take(s->offset, piece, &words, &why));
    REQUIRE(held.back());
  }
  CHECK_FALSE(ring->allocate(8));  // full
  CHECK_FALSE(ring->allocate(64 << 10));
  held[1].reset();  // released out of order: the oldest still holds the ring
  CHECK_FALSE(ring->allocate(8));
  held[0].reset();  // now the first two are free, at the start of the region
  auto s = ring->allocate(2 * piece);
  REQUIRE(s);
  CHECK(s->offset == offsets[0]);  // wrapped to the start
  fill(*ring, *s, 7);
  CHECK_FALSE(ring->allocate(8));
  for (auto& h : held) h.reset();
  auto t = ring->allocate(8);
  REQUIRE(t);
  CHECK(t->offset == s->offset + 2 * piece + lane_slot_header_bytes);  // after the wrapped slot, still held
  CHECK_THROWS_AS(ring->allocate(12), error);  // not whole words
}

TEST_CASE("lane: references outside the region, of another size or to unpublished slots are refused", "[net][lane]") {
  auto ring = lane_ring::create(64 << 10);
  auto view = lane_view::open(ring->offer());
  auto s = ring->allocate(1024);
  REQUIRE(s);
  const capnp::word* words = nullptr;
  std::string why;
  CHECK_FALSE(view->take(s->offset, 1024, &words, &why));  // not published yet
  CHECK_THAT(why, Catch::Matchers::Contains("not published"));
  fill(*ring, *s, 3);
  CHECK_FALSE(view->take(s->offset, 512, &words, &why));  // another size: refused, and the slot released
  CHECK_THAT(why, Catch::Matchers::Contains("does not hold"));
  for (auto [offset, bytes] : std::vector<std::pair<uint64_t, uint64_t>>{{0, 8},
                                                                         {8, 8},
                                                                         {s->offset + 4, 8},
                                                                         {s->offset, 0},
                                                                         {s->offset, 12},
                                                                         {64 << 10, 8},
                                                                         {s->offset, ~uint64_t(0) - 7},
                                                                         {~uint64_t(0) - 7, 16}}) {
    CHECK_FALSE(view->take(offset, bytes, &words, &why));
    CHECK_FALSE(why.empty());
  }
}

TEST_CASE("lane: offers with foreign names, sizes or regions are refused, and an unopened region is removed by its ring",
          "[net][lane]") {
  CHECK_THROWS_AS(decode_lane_offer("short", 5), error);
  lane_offer o{1, 64 << 10, "/etc-passwd"};
  CHECK_THROWS_AS(decode_lane_offer(encode_lane_offer(o).data(), encode_lane_offer(o).size()), error);
  o.name = "/troupe-../x";
  CHECK_THROWS_AS(decode_lane_offer(encode_lane_offer(o).data(), encode_lane_offer(o).size()), error);
  o.name = "/troupe-nonexistent-0";
  CHECK_THROWS_WITH(lane_view::open(o), Catch::Matchers::Contains("cannot open"));

  std::string name;
  {
    auto ring = lane_ring::create(64 << 10);
    auto offer = ring->offer();
    name = offer.name;
    offer.bytes = 128 << 10;  // the region is not what the offer says
    CHECK_THROWS_WITH(lane_view::open(offer), Catch::Matchers::Contains("the offer said"));
    // A region others may read is not used.
    ::shm_unlink(name.c_str());
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0644);
    REQUIRE(fd >= 0);
    ::fchmod(fd, 0644);
    REQUIRE(::ftruncate(fd, 64 << 10) == 0);
    ::close(fd);
    offer.bytes = 64 << 10;
    CHECK_THROWS_WITH(lane_view::open(offer), Catch::Matchers::Contains("not this user's alone"));
    CHECK(name_exists(name));
  }
  CHECK_FALSE(name_exists(name));  // the ring removed its name
}

TEST_CASE("lane: regions left behind by a process that is gone are removed, a live process's are kept", "[net][lane]") {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  REQUIRE(child > 0);
  int status = 0;
  ::waitpid(child, &status, 0);  // reaped: its pid names no process now
  const std::string dead = "/troupe-" + std::to_string(child) + "-00000000000000aa";
  const std::string live = "/troupe-" + std::to_string(::getpid()) + "-00000000000000bb";
  for (const std::string& n : {dead, live}) {
    const int fd = ::shm_open(n.c_str(), O_CREAT | O_RDWR, 0600);
    REQUIRE(fd >= 0);
    ::close(fd);
  }
  CHECK(remove_stale_lanes() >= 1);
  CHECK_FALSE(name_exists(dead));
  CHECK(name_exists(live));
  ::shm_unlink(live.c_str());
}
