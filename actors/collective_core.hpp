#pragma once

// A collective among the N members of a group, without actors or sockets:
// allreduce of a flat float buffer (a ring for large buffers, recursive
// doubling for small ones), broadcast from a root, and a barrier. Each member
// runs one core; the caller sends every message the core returns to the
// message's receiver and feeds the messages that arrive to accept().
//
// Each operation is, for each member, a fixed program of sends and receives
// run in order: a piece that arrives before its turn is kept until then. So
// every sum is taken in an order fixed by the algorithm and the ranks, never
// by the order messages arrive in, and every member ends with the same bits.

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace troupe::actors {

enum class collective_kind : uint8_t { allreduce = 0, broadcast = 1, barrier = 2 };

/// What a message's payload holds: float32, or bfloat16 (rounded to nearest
/// even; sums are still taken in float32).
enum class collective_payload : uint8_t { f32 = 0, bf16 = 1 };

/// How an operation runs; chosen per operation from its kind, N and size.
enum class collective_algorithm : uint8_t {
  none,                ///< N = 1: nothing to exchange
  ring,                ///< allreduce: reduce-scatter then all-gather around the ring
  recursive_doubling,  ///< allreduce: pairwise exchanges, extra members folded in first
  chain,               ///< broadcast: a pipeline root -> root+1 -> ...
  binomial_tree,       ///< broadcast: a binomial tree rooted at the root
  dissemination,       ///< barrier: ceil(log2 N) rounds to rank + 2^k
};
const char* to_string(collective_algorithm a);

struct collective_options {
  /// The most elements one message carries: a chunk goes in pieces of this
  /// size so that the next hop forwards a piece while the rest still comes.
  /// 65 536: 16 384 and 262 144 did no better for the ring at 16 MiB
  /// (docs/benchmarks.md, "Collective bandwidth").
  int64_t piece_elements = int64_t{1} << 16;
  /// An allreduce of fewer bytes (as float32) than this runs by recursive
  /// doubling, a broadcast by a binomial tree; the rest by the ring and the
  /// chain. 8 KiB: below it recursive doubling beat the ring on every link
  /// and N measured (loopback, 1 Gbit/s and 200 Mbit/s, N = 2-4), above it
  /// the ring won on some (docs/benchmarks.md, "Collective bandwidth").
  int64_t small_threshold_bytes = 8192;
  collective_payload payload = collective_payload::f32;
  /// Operations not yet started whose messages are kept when they arrive
  /// early; a message further ahead is rejected. Allreduces and barriers let
  /// no member run more than one operation ahead of another; a broadcast's
  /// root is done once it has sent, so each broadcast whose root it is lets a
  /// member run one more ahead (the caller raises this, or puts a barrier
  /// after a broadcast).
  uint64_t ops_ahead = 1;
  /// The float32 messages the core returns view the buffer (collective_message::view)
  /// instead of copying it: the caller must write each one out (to_wire) before
  /// its next call into the core, which may change those elements. Spares a
  /// copy and an allocation per piece; the transport's members set it.
  bool send_views = false;

  collective_options& piece(int64_t elements) {
    piece_elements = elements;
    return *this;
  }
  collective_options& small_threshold(int64_t bytes) {
    small_threshold_bytes = bytes;
    return *this;
  }
  collective_options& bf16(bool on = true) {
    payload = on ? collective_payload::bf16 : collective_payload::f32;
    return *this;
  }
  collective_options& ahead(uint64_t ops) {
    ops_ahead = ops;
    return *this;
  }
  collective_options& views(bool on = true) {
    send_views = on;
    return *this;
  }
};

/// One piece of one round of one operation. `sender` and `receiver` are
/// member ids (not ranks); `offset` is the piece's first element in the
/// buffer; the payload is `data` (f32) or `bf16`, the other one empty, or an
/// f32 payload held elsewhere (`view`, `view_count`; `data` then empty): the
/// sender's buffer (collective_options::send_views) or a received frame
/// (view_from_wire), valid only as long as that memory is. A core that keeps a
/// message past accept() keeps its own copy (own()).
struct collective_message {
  uint64_t epoch = 0;
  uint64_t op = 0;
  collective_kind kind = collective_kind::allreduce;
  int32_t round = 0;
  int32_t chunk = 0;
  int64_t offset = 0;
  int32_t sender = -1;
  int32_t receiver = -1;
  std::vector<float> data;
  std::vector<uint16_t> bf16;
  const float* view = nullptr;
  int64_t view_count = 0;

  /// The float32 payload, wherever it is held.
  const float* f32() const { return view != nullptr ? view : data.data(); }
  std::size_t f32_count() const { return view != nullptr ? static_cast<std::size_t>(view_count) : data.size(); }
  /// Copies a viewed payload into `data`: the message no longer depends on that memory.
  void own() {
    if (view == nullptr) return;
    data.assign(view, view + view_count);
    view = nullptr;
    view_count = 0;
  }
};

/// Why a message was rejected (never applied).
enum class collective_reject : uint8_t {
  wrong_epoch,     ///< another group epoch
  not_member,      ///< the sender is not a member of the group
  wrong_receiver,  ///< meant for another member
  stale_op,        ///< an operation already finished
  future_op,       ///< an operation further ahead than options.ops_ahead
  wrong_kind,      ///< not the kind of the operation under way
  wrong_round,     ///< a round (phase) out of range, or one in which the sender sends nothing here
  wrong_chunk,     ///< not the chunk the sender sends here in that round
  wrong_piece,     ///< an offset or a size that is not one of the round's pieces
  wrong_payload,   ///< f32 where bf16 is expected, or the other way round
  duplicate,       ///< a piece already taken
};
constexpr std::size_t collective_reject_count = 11;
const char* to_string(collective_reject r);

struct collective_stats {
  std::array<uint64_t, collective_reject_count> rejected{};
  uint64_t accepted = 0;  ///< messages taken (applied, or kept until their turn)
  uint64_t early = 0;     ///< of those, kept: they came before their turn in the operation under way
  uint64_t ahead = 0;     ///< messages kept for an operation not yet started (taken, or rejected, when it starts)
  uint64_t get(collective_reject r) const { return rejected[static_cast<std::size_t>(r)]; }
  uint64_t total_rejected() const;
};

/// One send or receive of a member's program for one operation (the core's own).
struct collective_step {
  int32_t round = 0, chunk = 0, peer = 0;  ///< peer: a rank
  int64_t offset = 0, count = 0;
  bool send = false;
  bool add = false;             ///< a receive: add into the buffer (else copy)
  bool incoming_first = false;  ///< the sum's first operand is the incoming piece
};

/// One member's side of the group's collectives. Operations run one at a
/// time, numbered 0, 1, 2, ... in the group's epoch, in the same order on
/// every member. Not thread-safe.
class collective_core {
public:
  /// `members`: the group's member ids (distinct; a member's rank is its
  /// position); `self`: this member's id. Throws troupe::error on a bad group
  /// or options.
  collective_core(std::vector<int32_t> members, int32_t self, uint64_t epoch, collective_options o = {});

  /// Sums the members' `buffer`s (n floats each, the same n everywhere) into
  /// every member's `buffer`, in place. The buffer must stay valid and
  /// untouched until done(). Returns the messages to send now.
  std::vector<collective_message> start_allreduce(uint64_t op, float* buffer, int64_t n);
  /// Copies member `root`'s buffer (an id) into every member's.
  std::vector<collective_message> start_broadcast(uint64_t op, int32_t root, float* buffer, int64_t n);
  /// Done on a member once every member has started it.
  std::vector<collective_message> start_barrier(uint64_t op);

  /// Takes a message meant for this member and returns the messages to send
  /// in answer. A message that does not fit is rejected, counted and never
  /// applied (see last_error()); the core goes on as before.
  std::vector<collective_message> accept(const collective_message& m);

  /// No operation under way (the last one finished).
  bool done() const { return !active_; }
  /// The number the next start must use.
  uint64_t next_op() const { return next_op_; }
  /// The algorithm of the operation under way, or of the last one.
  collective_algorithm algorithm() const { return algorithm_; }
  /// What an allreduce of n elements would run.
  collective_algorithm allreduce_algorithm(int64_t n) const;
  int32_t rank() const { return rank_; }
  int32_t size() const { return static_cast<int32_t>(members_.size()); }
  uint64_t epoch() const { return epoch_; }
  const collective_stats& stats() const { return stats_; }
  /// Why the last rejected message was rejected.
  const std::string& last_error() const { return last_error_; }

private:
  using step = collective_step;
  enum class slot : uint8_t { pending, kept, taken };

  std::vector<collective_message> begin(uint64_t op, collective_kind kind, collective_algorithm a,
                                        std::vector<step> program, float* buffer, int64_t n);
  void require_startable(uint64_t op, int64_t n, const float* buffer, const char* what) const;
  /// Runs the program from the cursor until a receive whose piece is not there.
  void run(std::vector<collective_message>& out);
  /// The operation's end: bf16 results rounded alike everywhere, the program let go.
  void finish();
  collective_message make(const step& s);
  /// Applies the receive `s`; `out`: the messages this call made so far.
  void apply(const step& s, const collective_message& m, std::vector<collective_message>& out);
  /// Checks epoch, sender, receiver and operation; false (counted) when rejected.
  bool check_header(const collective_message& m);
  /// The receive step `m` is, of the operation under way; -1 (counted) when rejected.
  int64_t find_step(const collective_message& m);
  void take(const collective_message& m, std::vector<collective_message>& out);
  void reject(collective_reject why, const collective_message& m, const std::string& what);
  int32_t rank_of(int32_t id) const;

  std::vector<int32_t> members_;
  std::map<int32_t, int32_t> ranks_;  // id -> rank
  int32_t self_ = 0, rank_ = 0;
  uint64_t epoch_ = 0;
  collective_options opt_;
  collective_stats stats_;
  std::string last_error_;

  // The operation under way.
  bool active_ = false;
  uint64_t op_ = 0, next_op_ = 0;
  collective_kind kind_ = collective_kind::allreduce;
  collective_algorithm algorithm_ = collective_algorithm::none;
  int32_t rounds_ = 0;
  float* buf_ = nullptr;
  int64_t n_ = 0;
  std::vector<step> program_;
  std::size_t cursor_ = 0;
  std::vector<slot> slots_;                                         // per step
  std::map<std::size_t, collective_message> kept_;                  // step -> its piece, come before its turn
  std::map<std::tuple<int32_t, int32_t, int64_t>, std::size_t> receives_;  // (peer, round, offset) -> step
  std::map<std::pair<int32_t, int32_t>, int32_t> round_chunk_;      // (peer, round) -> chunk
  std::vector<collective_message> early_;                           // of operations not yet started
  std::vector<float> scratch_;                                      // a bf16 piece in float32
};

/// bfloat16 of `x`, rounded to nearest even (a NaN stays a NaN).
uint16_t to_bf16(float x);
float from_bf16(uint16_t b);

} // namespace troupe::actors
