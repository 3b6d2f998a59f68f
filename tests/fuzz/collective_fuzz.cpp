// libFuzzer target: the collective core (actors/collective_core.hpp) of a
// whole group in memory. The group's own messages are delivered in an order
// the input picks, with altered copies of them mixed in (a field changed: the
// epoch, op, kind, round, chunk, offset, sender, receiver or the payload) and
// exact copies (a frame delivered twice).
// Checked on every input, besides what AddressSanitizer checks:
//   * a rejected message is never applied: the receiver's buffer keeps its bits;
//   * once every real message is delivered (and no altered one was taken),
//     every member is done and holds the same bits: the exact sum (allreduce)
//     or the root's buffer (broadcast).
// Built and run by scripts/fuzz.sh BUILD_DIR SECONDS collective.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "actors/collective_core.hpp"

using namespace troupe::actors;

namespace {

/// The input, read a byte at a time (zeros once it is used up).
struct input {
  const uint8_t* p;
  std::size_t left;
  uint8_t byte() {
    if (left == 0) return 0;
    --left;
    return *p++;
  }
  int64_t wide() {
    int64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | byte();
    return v;
  }
};

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "collective_fuzz: %s\n", what);
  std::abort();
}

/// A copy of `m` with one field changed, as the input says.
collective_message altered(collective_message m, input& in, int32_t members) {
  const uint8_t field = in.byte() % 11;
  const int8_t delta = static_cast<int8_t>(in.byte() | 1);
  switch (field) {
    case 0: m.epoch += static_cast<uint64_t>(delta); break;
    case 1: m.op += static_cast<uint64_t>(delta); break;
    case 2: m.kind = static_cast<collective_kind>(in.byte() % 4); break;
    case 3: m.round += delta; break;
    case 4: m.chunk += delta; break;
    case 5: m.offset += delta; break;
    case 6: m.offset = in.wide(); break;
    case 7: m.sender = static_cast<int32_t>(in.byte()) - 2 + (in.byte() % 2 ? members * 3 : 0); break;
    case 8: m.receiver = static_cast<int32_t>(in.byte() % (members * 3 + 2)) - 1; break;
    case 9:  // the payload one element shorter or longer, or of the other type
      if (delta % 3 == 0) {
        m.bf16.assign(m.data.size(), 0x3f80);
        m.data.clear();
      } else if (!m.data.empty() && delta > 0) {
        m.data.pop_back();
      } else {
        m.data.push_back(1.0f);
      }
      break;
    default: m.round = static_cast<int32_t>(in.wide()); m.chunk = static_cast<int32_t>(in.wide()); break;
  }
  return m;
}

struct group {
  std::vector<int32_t> ids;  // member ids, not 0..n-1: ids and ranks differ
  std::vector<collective_core> cores;
  std::vector<std::vector<float>> bufs;
  std::vector<collective_message> pool;  // sent, not yet delivered
  bool altered_taken = false;

  std::size_t index_of(int32_t id) const {
    for (std::size_t i = 0; i < ids.size(); ++i)
      if (ids[i] == id) return i;
    return ids.size();
  }
  void keep(std::vector<collective_message> out) {
    for (collective_message& m : out) {
      m.own();  // as the transport's to_wire does before the core is called again
      pool.push_back(std::move(m));
    }
  }
  /// Delivers `m` to its receiver (the member `to` when the receiver is not one).
  void deliver(const collective_message& m, std::size_t to, bool is_altered) {
    const std::size_t r = index_of(m.receiver) < ids.size() ? index_of(m.receiver) : to;
    const std::vector<float> before = bufs[r];
    const collective_stats s0 = cores[r].stats();
    std::vector<collective_message> out = cores[r].accept(m);
    const collective_stats& s1 = cores[r].stats();
    if (s1.total_rejected() > s0.total_rejected()) {
      if (!out.empty()) broken("a rejected message produced messages");
      if (std::memcmp(before.data(), bufs[r].data(), before.size() * sizeof(float)) != 0)
        broken("a rejected message changed the buffer");
    } else if (is_altered) {
      altered_taken = true;  // it may have been applied: the final result is not checked
    }
    keep(std::move(out));
  }
};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  input in{data, size};
  const uint8_t conf = in.byte();
  const int32_t n = 1 + conf % 4;
  const bool broadcast = (conf >> 2) & 1, bf16 = (conf >> 3) & 1, small = (conf >> 4) & 1;
  const int64_t count = in.byte() % 97;
  collective_options o;
  o.piece(1 + in.byte() % 16).bf16(bf16).views((conf >> 5) & 1).small_threshold(small ? int64_t{1} << 40 : 0);
  group g;
  for (int32_t i = 0; i < n; ++i) g.ids.push_back(3 * i + 1);
  const int32_t root = g.ids[static_cast<std::size_t>(in.byte() % n)];
  for (int32_t i = 0; i < n; ++i) {
    g.cores.emplace_back(g.ids, g.ids[static_cast<std::size_t>(i)], 7, o);
    std::vector<float> b(static_cast<std::size_t>(count));
    for (int64_t j = 0; j < count; ++j) b[static_cast<std::size_t>(j)] = static_cast<float>((i * 5 + j * 3) % 16);  // exact in bf16, and summed
    g.bufs.push_back(std::move(b));
  }
  std::vector<float> want(static_cast<std::size_t>(count), 0.0f);
  for (int64_t j = 0; j < count; ++j)
    for (int32_t i = 0; i < n; ++i)
      want[static_cast<std::size_t>(j)] = broadcast ? g.bufs[g.index_of(root)][static_cast<std::size_t>(j)]
                                                    : want[static_cast<std::size_t>(j)] + g.bufs[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)];
  for (int32_t i = 0; i < n; ++i) {
    collective_core& c = g.cores[static_cast<std::size_t>(i)];
    float* b = g.bufs[static_cast<std::size_t>(i)].data();
    g.keep(broadcast ? c.start_broadcast(0, root, b, count) : c.start_allreduce(0, b, count));
  }
  // The input's order, altered copies mixed in; then what is left, first in first out.
  for (int guard = 0; guard < 100000 && !g.pool.empty(); ++guard) {
    const bool chosen = in.left > 0;
    const std::size_t at = chosen ? in.byte() % g.pool.size() : 0;
    const uint8_t action = chosen ? in.byte() : 1;
    if (action % 4 == 0) {
      const collective_message m = altered(g.pool[at], in, n);
      g.deliver(m, in.byte() % static_cast<std::size_t>(n), true);
      continue;
    }
    if (action % 8 == 2) {  // a frame delivered twice: the copy goes now, the message stays
      g.deliver(g.pool[at], 0, false);
      continue;
    }
    const collective_message m = std::move(g.pool[at]);
    g.pool.erase(g.pool.begin() + static_cast<std::ptrdiff_t>(at));
    g.deliver(m, 0, false);
  }
  if (!g.pool.empty()) broken("messages still undelivered after 100 000 deliveries");
  if (g.altered_taken) return 0;
  for (int32_t i = 0; i < n; ++i) {
    if (!g.cores[static_cast<std::size_t>(i)].done()) broken("a member is not done after every message");
    if (std::memcmp(g.bufs[static_cast<std::size_t>(i)].data(), want.data(), want.size() * sizeof(float)) != 0)
      broken("a member's result is not the expected one");
  }
  return 0;
}
