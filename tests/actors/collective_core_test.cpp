// The collective core without actors: N cores in one process exchange their
// messages through a simulator that delivers them in order or in a seeded
// random order. Allreduce by ring and by recursive doubling, broadcast,
// barrier, operations one after another, bfloat16 payloads, and every reason
// a message is rejected.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "actors/collective_core.hpp"
#include "tests/test_util.hpp"

using namespace troupe;
using namespace troupe::actors;
using Catch::Matchers::Contains;

namespace {

/// The tests' options: the ring (and the chain) for every size unless a test sets the threshold
/// (the default, 8 KiB, sends small buffers by recursive doubling).
collective_options ring_options() { return collective_options().small_threshold(0); }

/// Member ids that are not their ranks.
std::vector<int32_t> ids_of(int n) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(40 - 3 * i);
  return ids;
}

/// Member r's input: values of several magnitudes, so that the order of a sum shows in its bits.
std::vector<float> input_of(int r, int64_t n) {
  std::mt19937 g(1234u + static_cast<unsigned>(r));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> e(-6, 6);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (float& v : x) v = std::ldexp(u(g), e(g));
  return x;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

/// N cores and the messages in flight among them.
struct group_sim {
  std::vector<int32_t> ids;
  std::vector<collective_core> cores;
  std::deque<collective_message> flight;
  std::mt19937_64 rng;
  bool random;
  int64_t delivered = 0;
  int64_t largest_piece = 0;
  /// Called after each delivery (e.g. to start the next operation on a member that is done).
  std::function<void()> after_delivery;

  group_sim(int n, collective_options o, uint64_t seed, bool random_order)
      : ids(ids_of(n)), rng(seed), random(random_order) {
    for (int r = 0; r < n; ++r) cores.emplace_back(ids, ids[r], 7, o);
  }
  int rank_of(int32_t id) const {
    for (std::size_t i = 0; i < ids.size(); ++i)
      if (ids[i] == id) return static_cast<int>(i);
    return -1;
  }
  void post(std::vector<collective_message> ms) {
    for (auto& m : ms) {
      largest_piece = std::max<int64_t>(largest_piece, static_cast<int64_t>(m.f32_count() + m.bf16.size()));
      m.own();  // as a transport writes it out: before the next call into a core
      flight.push_back(std::move(m));
    }
  }
  /// Delivers one message (the oldest, or one at random); false when none is in flight.
  bool step() {
    if (flight.empty()) return false;
    if (random) std::swap(flight[rng() % flight.size()], flight.front());
    collective_message m = std::move(flight.front());
    flight.pop_front();
    ++delivered;
    post(cores.at(static_cast<std::size_t>(rank_of(m.receiver))).accept(m));
    if (after_delivery) after_delivery();
    return true;
  }
  void drain() {
    while (step()) {
    }
  }
  bool all_done() const {
    for (const auto& c : cores)
      if (!c.done()) return false;
    return true;
  }
  uint64_t rejected() const {
    uint64_t t = 0;
    for (const auto& c : cores) t += c.stats().total_rejected();
    return t;
  }
};

/// Every member's buffer after an allreduce of input_of(r, n).
std::vector<std::vector<float>> allreduce(int n_members, int64_t n, collective_options o, uint64_t seed, bool random,
                                          collective_algorithm* algorithm = nullptr, uint64_t* early = nullptr) {
  group_sim sim(n_members, o, seed, random);
  std::vector<std::vector<float>> bufs;
  for (int r = 0; r < n_members; ++r) bufs.push_back(input_of(r, n));
  for (int r = 0; r < n_members; ++r) sim.post(sim.cores[r].start_allreduce(0, bufs[r].data(), n));
  sim.drain();
  CHECK(sim.all_done());
  CHECK(sim.rejected() == 0u);
  CHECK(sim.largest_piece <= o.piece_elements);
  if (algorithm) *algorithm = sim.cores[0].algorithm();
  if (early)
    for (const auto& c : sim.cores) *early += c.stats().early;
  return bufs;
}

/// The allreduce of input_of(0..N-1, n), in any order of delivery, against
/// in-order delivery (bit for bit) and a double-precision sum (within `tolerance` * sum |x|).
void check_allreduce(int n_members, int64_t n, collective_options o, collective_algorithm expected, double tolerance) {
  INFO("N = " << n_members << ", n = " << n << ", piece = " << o.piece_elements);
  collective_algorithm a = collective_algorithm::none;
  uint64_t early = 0;
  const auto in_order = allreduce(n_members, n, o, 0, false, &a, &early);
  CHECK(a == (n_members == 1 ? collective_algorithm::none : expected));
  // The ring receives from one neighbour in the order it sends: over links
  // that keep order, no piece waits for its turn.
  if (expected == collective_algorithm::ring) CHECK(early == 0u);
  for (uint64_t seed : {1u, 2u}) {
    const auto shuffled = allreduce(n_members, n, o, seed * 7919 + static_cast<uint64_t>(n), true);
    for (int r = 0; r < n_members; ++r) {
      CHECK(same_bits(shuffled[r], in_order[0]));
      CHECK(same_bits(in_order[r], in_order[0]));
    }
  }
  std::vector<std::vector<float>> x;
  for (int r = 0; r < n_members; ++r) x.push_back(input_of(r, n));
  int64_t off = 0;
  for (int64_t i = 0; i < n; ++i) {
    double sum = 0, size = 0;
    for (int r = 0; r < n_members; ++r) sum += x[r][i], size += std::fabs(x[r][i]);
    if (std::fabs(in_order[0][i] - sum) > tolerance * size) ++off;
  }
  CHECK(off == 0);
}

std::vector<int64_t> sizes_for(int n_members) { return {0, 1, n_members - 1, n_members, 1000, 100003}; }

} // namespace

TEST_CASE("collective: a ring allreduce gives every member the same bits in any delivery order", "[collective]") {
  for (int n_members = 1; n_members <= 9; ++n_members)
    for (int64_t n : sizes_for(n_members))
      check_allreduce(n_members, n, ring_options().piece(1000), collective_algorithm::ring,
                      n_members * std::numeric_limits<float>::epsilon());
  // Small pieces: many per chunk, and many pieces come before their turn.
  for (int n_members : {2, 5, 8}) {
    check_allreduce(n_members, 1000, ring_options().piece(7), collective_algorithm::ring,
                    n_members * std::numeric_limits<float>::epsilon());
  }
}

TEST_CASE("collective: pieces that view the buffer (send_views) give the same bits in any delivery order",
          "[collective]") {
  // The transport's setting: a message made in a call views the buffer, and
  // the sim copies it out when the call returns. A call that sends a piece and
  // then applies a kept one over it must not change what that piece carries.
  for (int n_members : {2, 3, 5, 8}) {
    const auto tolerance = n_members * std::numeric_limits<float>::epsilon();
    check_allreduce(n_members, 1000, ring_options().piece(7).views(), collective_algorithm::ring, tolerance);
    check_allreduce(n_members, 100003, ring_options().piece(1000).views(), collective_algorithm::ring, tolerance);
    check_allreduce(n_members, 1000, ring_options().piece(7).small_threshold(int64_t{1} << 40).views(),
                    collective_algorithm::recursive_doubling, tolerance);
    CHECK(same_bits(allreduce(n_members, 1000, ring_options().piece(7).views(), 3, true)[0],
                    allreduce(n_members, 1000, ring_options().piece(7), 0, false)[0]));
  }
}

TEST_CASE("collective: recursive doubling for small buffers works for any member count", "[collective]") {
  const auto small = ring_options().piece(1000).small_threshold(int64_t{1} << 40);
  for (int n_members = 1; n_members <= 9; ++n_members)
    for (int64_t n : sizes_for(n_members))
      check_allreduce(n_members, n, small, collective_algorithm::recursive_doubling,
                      n_members * std::numeric_limits<float>::epsilon());
  check_allreduce(7, 100, ring_options().piece(3).small_threshold(4000), collective_algorithm::recursive_doubling,
                  7 * std::numeric_limits<float>::epsilon());
}

TEST_CASE("collective: the ring and recursive doubling sum in different orders, each fixed", "[collective]") {
  // The inputs are such that the order of a sum shows: the bit-for-bit checks above would see a changed order.
  for (int n_members : {3, 5, 9}) {
    const auto ring = allreduce(n_members, 1000, ring_options(), 0, false);
    const auto doubling = allreduce(n_members, 1000, ring_options().small_threshold(int64_t{1} << 20), 0, false);
    CHECK_FALSE(same_bits(ring[0], doubling[0]));
  }
}

TEST_CASE("collective: the threshold chooses between recursive doubling and the ring", "[collective]") {
  collective_core c(ids_of(4), ids_of(4)[1], 0, ring_options().small_threshold(4096));
  CHECK(c.allreduce_algorithm(0) == collective_algorithm::recursive_doubling);
  CHECK(c.allreduce_algorithm(1023) == collective_algorithm::recursive_doubling);
  CHECK(c.allreduce_algorithm(1024) == collective_algorithm::ring);
  CHECK(collective_core(ids_of(4), 40, 0).allreduce_algorithm(2047) == collective_algorithm::recursive_doubling);  // the default: 8 KiB
  CHECK(collective_core(ids_of(4), 40, 0).allreduce_algorithm(2048) == collective_algorithm::ring);
  CHECK(collective_core(ids_of(1), 40, 0).allreduce_algorithm(5) == collective_algorithm::none);
  CHECK(collective_core(ids_of(3), 37, 0, ring_options().small_threshold(7)).allreduce_algorithm(1) ==
        collective_algorithm::recursive_doubling);
  CHECK(collective_core(ids_of(3), 37, 0, ring_options().small_threshold(7)).allreduce_algorithm(2) ==
        collective_algorithm::ring);
}

TEST_CASE("collective: one member is its own result and sends nothing", "[collective]") {
  collective_core c({5}, 5, 3);
  std::vector<float> x{1.5f, -2.0f, 3.25f};
  CHECK(c.start_allreduce(0, x.data(), 3).empty());
  CHECK(c.done());
  CHECK(x == std::vector<float>{1.5f, -2.0f, 3.25f});
  CHECK(c.start_broadcast(1, 5, x.data(), 3).empty());
  CHECK(c.start_barrier(2).empty());
  CHECK(c.done());
  CHECK(c.next_op() == 3u);
  CHECK(c.algorithm() == collective_algorithm::none);
}

TEST_CASE("collective: chunks differ by at most one element, pieces hold at most piece_elements", "[collective]") {
  // N = 4, n = 10: chunks of 3, 3, 2, 2; member 2 first sends its chunk, [6, 8).
  group_sim sim(4, ring_options().piece(2), 0, false);
  std::vector<std::vector<float>> bufs;
  for (int r = 0; r < 4; ++r) bufs.push_back(input_of(r, 10));
  std::vector<std::vector<collective_message>> first;
  for (int r = 0; r < 4; ++r) first.push_back(sim.cores[r].start_allreduce(0, bufs[r].data(), 10));
  REQUIRE(first[0].size() == 2);  // chunk 0, [0, 3): pieces of 2 and 1
  CHECK(first[0][0].data.size() == 2);
  CHECK(first[0][1].data.size() == 1);
  CHECK(first[0][1].offset == 2);
  REQUIRE(first[2].size() == 1);
  CHECK(first[2][0].offset == 6);
  CHECK(first[2][0].chunk == 2);
  CHECK(first[2][0].receiver == sim.ids[3]);
  // Each piece goes on as soon as it is in, not the whole chunk: member 3
  // gets the first piece of member 2's chunk and sends it on, summed, at once.
  std::vector<collective_message> got = sim.cores[3].accept(first[2][0]);
  REQUIRE(got.size() == 1);
  CHECK(got[0].round == 1);
  CHECK(got[0].chunk == 2);
  CHECK(got[0].offset == 6);
  CHECK(got[0].receiver == sim.ids[0]);
  CHECK(got[0].data == std::vector<float>{bufs[2][6] + input_of(3, 10)[6], bufs[2][7] + input_of(3, 10)[7]});
  // N = 5, n = 2: chunks 2 to 4 are empty, and still go round as empty pieces.
  group_sim wide(5, ring_options(), 0, false);
  std::vector<float> y(2, 1.0f);
  const auto m = wide.cores[4].start_allreduce(0, y.data(), 2);
  REQUIRE(m.size() == 1);
  CHECK(m[0].data.empty());
  CHECK(m[0].offset == 2);
}

TEST_CASE("collective: broadcast from every root, by a chain and by a binomial tree", "[collective]") {
  for (int n_members = 1; n_members <= 9; ++n_members)
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000}})
      for (bool tree : {false, true})
        for (int root = 0; root < n_members; ++root) {
          INFO("N = " << n_members << ", n = " << n << ", root = " << root << ", tree = " << tree);
          auto o = ring_options().piece(100).small_threshold(tree ? int64_t{1} << 30 : 0);
          group_sim sim(n_members, o, 31 * n_members + root, true);
          std::vector<std::vector<float>> bufs;
          for (int r = 0; r < n_members; ++r) bufs.push_back(input_of(r, n));
          for (int r = 0; r < n_members; ++r)
            sim.post(sim.cores[r].start_broadcast(0, sim.ids[root], bufs[r].data(), n));
          sim.drain();
          CHECK(sim.all_done());
          CHECK(sim.rejected() == 0u);
          for (int r = 0; r < n_members; ++r) CHECK(same_bits(bufs[r], input_of(root, n)));
          const auto want = n_members == 1 ? collective_algorithm::none
                            : tree         ? collective_algorithm::binomial_tree
                                           : collective_algorithm::chain;
          CHECK(sim.cores[0].algorithm() == want);
          // Every member but the root gets each piece once.
          CHECK(sim.delivered == static_cast<int64_t>(n_members - 1) * std::max<int64_t>(1, (n + 99) / 100));
        }
}

TEST_CASE("collective: a barrier is done on no member before every member started it", "[collective]") {
  for (int n_members = 1; n_members <= 9; ++n_members)
    for (int late = 0; late < n_members; ++late) {
      INFO("N = " << n_members << ", late member " << late);
      group_sim sim(n_members, ring_options(), 100 + late, true);
      for (int r = 0; r < n_members; ++r)
        if (r != late) sim.post(sim.cores[r].start_barrier(0));
      sim.drain();
      for (int r = 0; r < n_members; ++r)
        if (r != late) CHECK(sim.cores[r].done() == (n_members == 1));
      sim.post(sim.cores[late].start_barrier(0));
      sim.drain();
      CHECK(sim.all_done());
      CHECK(sim.rejected() == 0u);
      if (n_members > 1) CHECK(sim.cores[late].algorithm() == collective_algorithm::dissemination);
    }
}

namespace {

/// Runs, on each of N members, a sequence of operations (allreduce of
/// sizes[k], a broadcast from member 1 for a negative size, a barrier for
/// size 0 at odd k), each member starting the next as soon as it is done with
/// the last; returns every member's buffers.
std::vector<std::vector<std::vector<float>>> run_sequence(int n_members, const std::vector<int64_t>& sizes,
                                                          collective_options o, uint64_t seed, bool random,
                                                          uint64_t* ahead = nullptr) {
  group_sim sim(n_members, o, seed, random);
  std::vector<std::vector<std::vector<float>>> bufs(static_cast<std::size_t>(n_members));
  for (int r = 0; r < n_members; ++r)
    for (std::size_t k = 0; k < sizes.size(); ++k)
      bufs[r].push_back(input_of(r * 100 + static_cast<int>(k), std::abs(sizes[k])));
  std::vector<std::size_t> next(static_cast<std::size_t>(n_members), 0);
  auto start_ready = [&] {
    for (int r = 0; r < n_members; ++r) {
      auto& c = sim.cores[r];
      if (!c.done() || next[r] == sizes.size()) continue;
      const std::size_t k = next[r]++;
      float* b = bufs[r][k].data();
      if (sizes[k] < 0) sim.post(c.start_broadcast(k, sim.ids[1], b, -sizes[k]));
      else if (sizes[k] == 0 && k % 2 == 1) sim.post(c.start_barrier(k));
      else sim.post(c.start_allreduce(k, b, sizes[k]));
    }
  };
  sim.after_delivery = start_ready;
  start_ready();
  sim.drain();
  CHECK(sim.all_done());
  CHECK(sim.rejected() == 0u);
  for (int r = 0; r < n_members; ++r) CHECK(next[r] == sizes.size());
  if (ahead)
    for (const auto& c : sim.cores) *ahead += c.stats().ahead;
  return bufs;
}

} // namespace

TEST_CASE("collective: operations one after another, with pieces of the next one arriving early", "[collective]") {
  // Threshold 400 bytes: 1000 and 333 go by the ring, 10, 0 and 1 by recursive
  // doubling, 50 by a binomial tree; the zeros at odd places are barriers.
  const std::vector<int64_t> sizes{1000, 10, -50, 0, 333, 0, 0, 1};
  // The root of the broadcast is done as soon as it has sent, and may start
  // the barrier while others are still in the allreduce before: two ahead.
  const auto o = ring_options().piece(16).small_threshold(400).ahead(2);
  for (int n_members : {2, 3, 5, 8}) {
    INFO("N = " << n_members);
    const auto in_order = run_sequence(n_members, sizes, o, 0, false);
    uint64_t ahead = 0;
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      const auto shuffled = run_sequence(n_members, sizes, o, seed, true, &ahead);
      for (int r = 0; r < n_members; ++r)
        for (std::size_t k = 0; k < sizes.size(); ++k) {
          INFO("seed " << seed << ", member " << r << ", op " << k);
          CHECK(same_bits(shuffled[r][k], in_order[0][k]));
          CHECK(same_bits(in_order[r][k], in_order[0][k]));
        }
    }
    CHECK(ahead > 0u);
    // The broadcast gave everyone member 1's buffer.
    CHECK(same_bits(in_order[0][2], input_of(100 + 2, 50)));
  }
}

TEST_CASE("collective: bfloat16 pieces, sums in float32, within the bound of their roundings", "[collective]") {
  CHECK(to_bf16(1.0f) == 0x3f80);
  CHECK(from_bf16(0x3f80) == 1.0f);
  CHECK(to_bf16(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);      // a tie goes to the even neighbour, down
  CHECK(to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82);  // a tie goes to the even neighbour, up
  CHECK(to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)) == 0x3f81);  // past the tie: up
  CHECK(to_bf16(-2.5f) == 0xc020);
  CHECK(std::isinf(from_bf16(to_bf16(std::numeric_limits<float>::infinity()))));
  CHECK(std::isinf(from_bf16(to_bf16(std::numeric_limits<float>::max()))));
  CHECK(std::isnan(from_bf16(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  for (float x : {0.1f, -3.7f, 1e-30f, 65504.0f}) {
    INFO(x);
    CHECK(std::fabs(from_bf16(to_bf16(x)) - x) <= std::ldexp(std::fabs(x), -8));
  }
  // A partial sum is rounded at most once per hop (N hops at most, one more
  // at the end) and each rounding is off by at most 2^-8 of what it rounds
  // (8 significant bits), which is at most the sum of the |x|.
  for (int n_members = 1; n_members <= 9; ++n_members)
    for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{100003}}) {
      const double bound = (n_members + 2) * std::ldexp(1.0, -8);
      check_allreduce(n_members, n, ring_options().piece(1000).bf16(), collective_algorithm::ring, bound);
      check_allreduce(n_members, n, ring_options().piece(1000).bf16().small_threshold(int64_t{1} << 40),
                      collective_algorithm::recursive_doubling, bound);
    }
  // Every member ends with bf16 values, the same ones whichever way they came.
  for (auto o : {ring_options().bf16(), ring_options().bf16().small_threshold(int64_t{1} << 40)}) {
    const auto r = allreduce(5, 999, o.piece(64), 3, true);
    int64_t not_bf16 = 0;
    for (float v : r[2]) not_bf16 += from_bf16(to_bf16(v)) != v;
    CHECK(not_bf16 == 0);
    CHECK_FALSE(same_bits(r[2], allreduce(5, 999, ring_options().piece(64), 3, true)[2]));
  }
}

namespace {

/// Three members in a ring allreduce of 10 elements in pieces of 2, started.
struct started_ring {
  group_sim sim{3, ring_options().piece(2), 0, false};
  std::vector<std::vector<float>> bufs;
  started_ring() {
    for (int r = 0; r < 3; ++r) bufs.push_back(input_of(r, 10));
    for (int r = 0; r < 3; ++r) sim.post(sim.cores[r].start_allreduce(0, bufs[r].data(), 10));
  }
  /// A message in flight to member `r`.
  collective_message to(int r) const {
    for (const auto& m : sim.flight)
      if (m.receiver == sim.ids[r]) return m;
    FAIL("no message in flight to member " << r);
    return {};
  }
};

} // namespace

TEST_CASE("collective: malformed and stale messages are rejected, counted and never applied", "[collective]") {
  const auto clean = allreduce(3, 10, ring_options().piece(2), 0, false);
  started_ring g;
  collective_core& c = g.sim.cores[0];
  const collective_message good = g.to(0);
  auto expect = [&](collective_message m, collective_reject why) {
    INFO(to_string(why));
    const uint64_t before = c.stats().get(why);
    CHECK(c.accept(m).empty());
    CHECK(c.stats().get(why) == before + 1);
    CHECK_THAT(c.last_error(), Contains(to_string(why)));
  };
  auto with = [&](std::function<void(collective_message&)> f) {
    collective_message m = good;
    f(m);
    return m;
  };
  expect(with([](auto& m) { m.epoch = 8; }), collective_reject::wrong_epoch);
  expect(with([](auto& m) { m.sender = 999; }), collective_reject::not_member);
  expect(with([&](auto& m) { m.receiver = g.sim.ids[1]; }), collective_reject::wrong_receiver);
  expect(with([](auto& m) { m.op = 2; }), collective_reject::future_op);
  expect(with([](auto& m) { m.kind = collective_kind::broadcast; }), collective_reject::wrong_kind);
  expect(with([](auto& m) { m.round = 4; }), collective_reject::wrong_round);
  expect(with([](auto& m) { m.round = -1; }), collective_reject::wrong_round);
  // Member 0's right neighbour sends it nothing.
  expect(with([&](auto& m) { m.sender = g.sim.ids[1]; }), collective_reject::wrong_round);
  expect(with([](auto& m) { m.chunk += 1; }), collective_reject::wrong_chunk);
  expect(with([](auto& m) { m.chunk = 99; }), collective_reject::wrong_chunk);
  expect(with([](auto& m) { m.offset += 1; }), collective_reject::wrong_piece);
  expect(with([](auto& m) { m.offset = 1000; }), collective_reject::wrong_piece);
  expect(with([](auto& m) { m.data.push_back(1.0f); }), collective_reject::wrong_piece);
  expect(with([](auto& m) { m.data.clear(); }), collective_reject::wrong_piece);
  expect(with([](auto& m) { m.bf16.assign(m.data.size(), 0); }), collective_reject::wrong_payload);
  // The same piece twice: taken (or kept) once.
  g.sim.post(c.accept(good));
  expect(good, collective_reject::duplicate);
  CHECK(c.stats().total_rejected() == 16u);
  CHECK(c.stats().get(collective_reject::stale_op) == 0u);
  g.sim.flight.erase(std::find_if(g.sim.flight.begin(), g.sim.flight.end(), [&](const collective_message& m) {
    return m.receiver == good.receiver && m.round == good.round && m.offset == good.offset;
  }));
  g.sim.drain();
  REQUIRE(g.sim.all_done());
  for (int r = 0; r < 3; ++r) CHECK(same_bits(g.bufs[r], clean[r]));
  // Once op 0 is finished its messages are stale; op 1's are kept until it
  // starts, then checked: a bad one is rejected then.
  expect(good, collective_reject::stale_op);
  CHECK(c.accept(with([](auto& m) {
               m.op = 1;
               m.chunk = 5;
             })).empty());
  CHECK(c.stats().ahead == 1u);
  // The same message of op 1 twice before op 1 starts: kept twice, taken once.
  const collective_message next = with([](auto& m) { m.op = 1; });
  CHECK(c.accept(next).empty());
  CHECK(c.accept(next).empty());
  CHECK(c.stats().ahead == 3u);
  std::vector<std::vector<float>> again;
  for (int r = 0; r < 3; ++r) again.push_back(input_of(r, 10));
  for (int r = 0; r < 3; ++r) g.sim.post(g.sim.cores[r].start_allreduce(1, again[r].data(), 10));
  CHECK(c.stats().get(collective_reject::wrong_chunk) == 3u);
  CHECK(c.stats().get(collective_reject::duplicate) == 2u);
  // The member 2 sent it too: that one is the duplicate now.
  g.sim.flight.erase(std::find_if(g.sim.flight.begin(), g.sim.flight.end(), [&](const collective_message& m) {
    return m.op == 1 && m.receiver == next.receiver && m.round == next.round && m.offset == next.offset;
  }));
  g.sim.drain();
  REQUIRE(g.sim.all_done());
  for (int r = 0; r < 3; ++r) CHECK(same_bits(again[r], clean[r]));
  CHECK(g.sim.cores[1].stats().total_rejected() == 0u);
}

TEST_CASE("collective: a bad group, bad options or an operation out of turn is an error", "[collective]") {
  using testing::message;
  CHECK_THROWS_MATCHES(collective_core({}, 0, 0), troupe::error, message(Contains("at least one member")));
  CHECK_THROWS_MATCHES(collective_core({1, 2, 1}, 1, 0), troupe::error, message(Contains("listed twice")));
  CHECK_THROWS_MATCHES(collective_core({1, 2}, 3, 0), troupe::error, message(Contains("not in its own group")));
  CHECK_THROWS_MATCHES(collective_core({1, 2}, 1, 0, ring_options().piece(0)), troupe::error,
                       message(Contains("piece_elements")));
  collective_core c({1, 2}, 1, 0);
  std::vector<float> x(4, 1.0f);
  CHECK_THROWS_MATCHES(c.start_allreduce(1, x.data(), 4), troupe::error, message(Contains("expected op 0")));
  CHECK_THROWS_MATCHES(c.start_allreduce(0, x.data(), -1), troupe::error, message(Contains("-1 elements")));
  CHECK_THROWS_MATCHES(c.start_allreduce(0, nullptr, 4), troupe::error, message(Contains("no buffer")));
  CHECK_THROWS_MATCHES(c.start_broadcast(0, 3, x.data(), 4), troupe::error, message(Contains("not a member")));
  CHECK_FALSE(c.start_allreduce(0, x.data(), 4).empty());
  CHECK_FALSE(c.done());
  CHECK_THROWS_MATCHES(c.start_barrier(1), troupe::error, message(Contains("under way")));
}
