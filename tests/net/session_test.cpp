// The session of a link (net/session.hpp) without sockets, threads or clocks:
// numbering, acknowledgements, resending after a reconnection, duplicates,
// gaps, the queue bound, the end of a session, resume or renew.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "net/session.hpp"
#include "net_test_util.hpp"

using namespace troupe;
using namespace troupe::net;
using Catch::Matchers::Contains;
using troupe::testing::tensor_message;

namespace {

const address source{1, role::worker, 0};
const address destination{0, role::shard, 0};

// A message frame whose tensor is `bytes` bytes, told apart by `seed`.
session_frame frame(uint32_t seed, int priority = 0, std::size_t bytes = 64) {
  return {make_message_frame(destination, tensor_message(source, destination, bytes, seed), 0), priority};
}

uint32_t seed_of(const session_frame& q) {
  envelope_reader r(q.f.msg, peer_limits());
  return static_cast<uint32_t>(r.root().getActivation().getMicroBatch());
}

// Ids 1000, 1001, ... for one side: a renewed session is told apart from the old one.
struct side {
  explicit side(uint64_t incarnation, uint64_t first_id, uint64_t max_queue_bytes = uint64_t(1) << 30)
      : s(counters, max_queue_bytes, [n = first_id]() mutable { return n++; }), incarnation(incarnation) {}
  session_counters counters;
  session s;
  uint64_t incarnation;
};

// Admits and queues `q` as transport::send does; false when refused.
bool send(session& s, session_frame q) {
  if (!s.admit(q.f.plain_bytes())) return false;
  s.enqueue(std::move(q));
  return true;
}

// Both sides offer what they know and take what the other offered, as a link's handshake does.
std::pair<session::outcome, session::outcome> handshake(side& a, side& b) {
  const session_info of_a = a.s.offer(a.incarnation), of_b = b.s.offer(b.incarnation);
  const auto taken = std::make_pair(a.s.take(of_b), b.s.take(of_a));
  a.s.open();
  b.s.open();
  return taken;
}

// Writes up to `n` frames of `from`'s queue to `to` (all of them arrive, except
// the indices in `lost`) and returns the seeds `to` delivered; the
// acknowledgement is left to acknowledge().
std::vector<uint32_t> transmit(side& from, side& to, std::size_t n, const std::vector<std::size_t>& lost = {}) {
  std::vector<uint32_t> delivered;
  for (std::size_t i = 0; i < n && !from.s.queue_empty(); ++i) {
    session_frame q = from.s.pop_front();
    const uint64_t seq = q.f.sequence;
    const uint32_t seed = seed_of(q);
    from.s.written(std::move(q));
    if (std::find(lost.begin(), lost.end(), i) != lost.end()) continue;
    if (to.s.duplicate(seq)) continue;
    to.s.deliver(seq, 64);
    delivered.push_back(seed);
  }
  return delivered;
}

// `to` acknowledges what it delivered, as a heartbeat's ack field does.
void acknowledge(side& from, const side& to) { from.s.acknowledge(std::min(to.s.delivered(), from.s.last_sent())); }

} // namespace

TEST_CASE("session: frames are numbered in the order written, a lower priority value overtakes", "[net][session]") {
  side a(1, 100);
  REQUIRE(send(a.s, frame(1, 5)));
  REQUIRE(send(a.s, frame(2, 5)));
  REQUIRE(send(a.s, frame(3, 0)));  // ahead of both
  REQUIRE(send(a.s, frame(4, 5)));  // behind the equal ones
  CHECK(a.s.last_sent() == 0);      // nothing numbered before it is written
  std::vector<std::pair<uint32_t, uint64_t>> order;
  while (!a.s.queue_empty()) {
    session_frame q = a.s.pop_front();
    CHECK(q.numbered);
    order.emplace_back(seed_of(q), q.f.sequence);
    a.s.written(std::move(q));
  }
  CHECK(order == std::vector<std::pair<uint32_t, uint64_t>>{{3, 1}, {1, 2}, {2, 3}, {4, 4}});
  CHECK(a.s.last_sent() == 4);
  CHECK(a.s.unacked_frames() == 4);

  // A frame written directly (send() on an idle link) takes the next number once.
  session_frame q = frame(5);
  a.s.number(q);
  a.s.number(q);
  CHECK(q.f.sequence == 5);
  CHECK(a.s.last_sent() == 5);
}

TEST_CASE("session: an acknowledged prefix frees its bytes, the rest waits", "[net][session]") {
  side a(1, 100);
  std::vector<uint64_t> bytes;
  for (uint32_t i = 1; i <= 3; ++i) {
    session_frame q = frame(i, 0, 64 * i);
    bytes.push_back(q.f.plain_bytes());
    REQUIRE(send(a.s, std::move(q)));
  }
  const uint64_t all = bytes[0] + bytes[1] + bytes[2];
  CHECK(a.s.queued_bytes() == all);
  for (int i = 0; i < 3; ++i) a.s.written(a.s.pop_front());
  CHECK(a.s.queued_bytes() == all);  // written is not acknowledged

  a.s.acknowledge(2);
  CHECK(a.s.queued_bytes() == bytes[2]);
  CHECK(a.s.unacked_frames() == 1);
  a.s.acknowledge(1);  // an older acknowledgement changes nothing
  CHECK(a.s.queued_bytes() == bytes[2]);
  CHECK(a.s.unacked_frames() == 1);
  a.s.acknowledge(3);
  CHECK(a.s.queued_bytes() == 0);
  CHECK(a.s.unacked_frames() == 0);

  // A frame the peer acknowledged while it was still being written is released when the write completes.
  REQUIRE(send(a.s, frame(4)));
  session_frame q = a.s.pop_front();
  a.s.acknowledge(q.f.sequence);
  a.s.written(std::move(q));
  CHECK(a.s.queued_bytes() == 0);
  CHECK(a.s.unacked_frames() == 0);
}

TEST_CASE("session: after a reconnection exactly the unacknowledged frames go again, in order", "[net][session]") {
  side a(1, 100), b(2, 200);
  CHECK(handshake(a, b) == std::make_pair(session::outcome::renewed, session::outcome::renewed));
  for (uint32_t i = 1; i <= 6; ++i) REQUIRE(send(a.s, frame(i)));
  CHECK(transmit(a, b, 2) == std::vector<uint32_t>{1, 2});
  acknowledge(a, b);  // 1 and 2
  CHECK(transmit(a, b, 2) == std::vector<uint32_t>{3, 4});  // delivered, not acknowledged yet
  // Frame 5 was being written when the link broke; 6 was never written.
  session_frame five = a.s.pop_front();
  a.s.interrupted(std::move(five));
  REQUIRE(send(a.s, frame(7, -10)));  // queued while the link is down: a low priority value does not overtake resends

  // The new link resumes: b says it delivered up to 4, so 5 alone goes again, ahead of 6 and 7.
  CHECK(handshake(a, b) == std::make_pair(session::outcome::resumed, session::outcome::resumed));
  CHECK(a.counters.resent == 1);
  std::vector<std::pair<uint32_t, uint64_t>> order;
  while (!a.s.queue_empty()) {
    session_frame q = a.s.pop_front();
    order.emplace_back(seed_of(q), q.f.sequence);
  }
  CHECK(order == std::vector<std::pair<uint32_t, uint64_t>>{{5, 5}, {7, 6}, {6, 7}});
  CHECK(b.counters.duplicates_dropped == 0);
  CHECK(b.counters.lost == 0);
}

TEST_CASE("session: a resend the peer delivered already is dropped as a duplicate, counted, never delivered twice",
          "[net][session]") {
  side a(1, 100), b(2, 200);
  handshake(a, b);
  for (uint32_t i = 1; i <= 4; ++i) REQUIRE(send(a.s, frame(i)));
  CHECK(transmit(a, b, 4) == std::vector<uint32_t>{1, 2, 3, 4});
  acknowledge(a, b);
  REQUIRE(send(a.s, frame(5)));
  REQUIRE(send(a.s, frame(6)));
  CHECK(transmit(a, b, 2) == std::vector<uint32_t>{5, 6});
  // b's offer was made before 5 and 6 arrived (a new link's hello goes out while the old link still
  // delivers), and their acknowledgement never reached a: a resends them.
  session_info of_b = b.s.offer(b.incarnation);
  of_b.delivered = 4;
  CHECK(a.s.take(of_b) == session::outcome::resumed);
  CHECK(a.counters.resent == 2);
  CHECK(transmit(a, b, 2).empty());
  CHECK(b.counters.duplicates_dropped == 2);
  CHECK(b.s.delivered() == 6);

  CHECK(b.s.duplicate(1));
  CHECK_FALSE(b.s.duplicate(7));
  CHECK(b.counters.duplicates_dropped == 3);
}

TEST_CASE("session: gaps in the sequence numbers received are counted lost, a skipped frame is not",
          "[net][session]") {
  side a(1, 100), b(2, 200);
  handshake(a, b);
  for (uint32_t i = 1; i <= 6; ++i) REQUIRE(send(a.s, frame(i)));
  CHECK(transmit(a, b, 6, {1, 2}) == std::vector<uint32_t>{1, 4, 5, 6});  // the 2nd and 3rd frames dropped
  CHECK(b.counters.lost == 2);
  CHECK(b.s.delivered() == 6);
  acknowledge(a, b);  // the sender forgets the lost ones too
  CHECK(a.s.unacked_frames() == 0);
  CHECK(a.s.queued_bytes() == 0);

  b.s.skip(7);  // a frame handed to no one (a forged source): the sequence goes on
  b.s.deliver(8, 64);
  CHECK(b.counters.lost == 2);
  CHECK(b.s.delivered() == 8);
  CHECK(b.s.delivered_any_thread() == 8);
}

TEST_CASE("session: more than max_queue_bytes queued or unacknowledged is refused with a clear error",
          "[net][session]") {
  const uint64_t one = frame(0).f.plain_bytes();
  side a(1, 100, 2 * one);
  REQUIRE(send(a.s, frame(1)));
  a.s.written(a.s.pop_front());  // unacknowledged bytes count too
  REQUIRE(send(a.s, frame(2)));
  const admission refused = a.s.admit(one);
  CHECK_FALSE(refused);
  CHECK(refused.held == 2 * one);
  CHECK(refused.bytes == one);
  CHECK(refused.limit == 2 * one);
  CHECK_THAT(refused.what(), Contains("max_queue_bytes") && Contains(std::to_string(2 * one)));
  CHECK(a.s.queued_bytes() == 2 * one);  // nothing reserved
  CHECK(a.s.queued_frames() == 1);

  a.s.acknowledge(1);
  const admission accepted = a.s.admit(one);
  CHECK(accepted);
  CHECK(accepted.what().empty());
  CHECK(a.s.queued_bytes() == 2 * one);
}

TEST_CASE("session: an ended session drops and counts what was queued or unacknowledged", "[net][session]") {
  side a(1, 100), b(2, 200);
  handshake(a, b);
  CHECK(a.s.up());
  CHECK(a.counters.up == 1);
  for (uint32_t i = 1; i <= 5; ++i) REQUIRE(send(a.s, frame(i)));
  transmit(a, b, 3);
  acknowledge(a, b);
  transmit(a, b, 1);  // 4 unacknowledged, 5 queued
  CHECK(a.s.close(true) == 2);
  CHECK(a.counters.dropped_at_down == 2);
  CHECK_FALSE(a.s.up());
  CHECK(a.counters.up == 0);
  CHECK(a.s.queued_bytes() == 0);
  CHECK(a.s.queued_frames() == 0);
  CHECK(a.s.unacked_frames() == 0);
  CHECK(a.s.last_sent() == 0);

  // What is sent after it waits for the next session, which numbers from 1 again.
  REQUIRE(send(a.s, frame(6)));
  CHECK(handshake(a, b).first == session::outcome::renewed);
  session_frame q = a.s.pop_front();
  CHECK(q.f.sequence == 1);
  CHECK(seed_of(q) == 6);
}

TEST_CASE("session: resume or renew, by the ids and incarnations both sides offer", "[net][session]") {
  side a(1, 100), b(2, 200);
  const session_info first = a.s.offer(a.incarnation);
  CHECK(first.session == 100);
  CHECK(first.peer_session == 0);
  CHECK(a.s.offered(first));
  CHECK(handshake(a, b) == std::make_pair(session::outcome::renewed, session::outcome::renewed));
  CHECK(a.s.offer(a.incarnation).peer_session == 200);

  SECTION("the same two sides resume") {
    CHECK(handshake(a, b) == std::make_pair(session::outcome::resumed, session::outcome::resumed));
    CHECK_FALSE(a.s.open());  // it did not begin again
    CHECK(a.counters.up == 1);
  }
  SECTION("a restarted peer (another incarnation) ends the session and starts another") {
    REQUIRE(send(a.s, frame(1)));
    side b2(3, 300);
    CHECK(handshake(a, b2) == std::make_pair(session::outcome::restarted, session::outcome::renewed));
    CHECK(a.counters.dropped_at_down == 1);
    CHECK(a.s.up());
    CHECK(a.counters.up == 1);
  }
  SECTION("a peer that declared this side dead offers a new session: this side's ends too") {
    for (uint32_t i = 1; i <= 2; ++i) REQUIRE(send(a.s, frame(i)));
    transmit(a, b, 1);
    b.s.close(true);
    CHECK(b.s.offer(b.incarnation).session == 201);
    CHECK(handshake(a, b) == std::make_pair(session::outcome::abandoned, session::outcome::renewed));
    CHECK(a.counters.dropped_at_down == 2);
    CHECK(a.s.delivered() == 0);
    CHECK(handshake(a, b) == std::make_pair(session::outcome::resumed, session::outcome::resumed));
  }
  SECTION("a session renewed during a handshake is no longer the one offered") {
    const session_info sent = a.s.offer(a.incarnation);
    CHECK(a.s.offered(sent));
    a.s.close(true);
    CHECK_FALSE(a.s.offered(sent));
    CHECK(a.s.offer(a.incarnation).session == 101);
    CHECK(a.s.offer(a.incarnation).peer_session == 0);
  }
}

TEST_CASE("session: an acknowledgement is due after ack_every_frames frames or ack_every_bytes bytes",
          "[net][session]") {
  side b(2, 200);
  for (uint64_t seq = 1; seq < session::ack_every_frames; ++seq) b.s.deliver(seq, 1);
  CHECK_FALSE(b.s.ack_due());
  b.s.deliver(session::ack_every_frames, 1);
  CHECK(b.s.ack_due());
  b.s.ack_sent();
  CHECK_FALSE(b.s.ack_due());
  b.s.deliver(session::ack_every_frames + 1, session::ack_every_bytes);
  CHECK(b.s.ack_due());
}
