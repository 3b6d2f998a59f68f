#include "actors/collective_core.hpp"

#include <algorithm>
#include <cstring>
#include <iterator>

#include "tensor/error.hpp"

namespace troupe::actors {

namespace {

using step = collective_step;
using program = std::vector<step>;

int32_t wrap(int64_t r, int32_t n) { return static_cast<int32_t>(((r % n) + n) % n); }

step send_step(int32_t round, int32_t chunk, int32_t peer, int64_t offset, int64_t count) {
  step s;
  s.round = round;
  s.chunk = chunk;
  s.peer = peer;
  s.offset = offset;
  s.count = count;
  s.send = true;
  return s;
}

step receive_step(int32_t round, int32_t chunk, int32_t peer, int64_t offset, int64_t count, bool add,
                  bool incoming_first) {
  step s = send_step(round, chunk, peer, offset, count);
  s.send = false;
  s.add = add;
  s.incoming_first = incoming_first;
  return s;
}

/// Calls f(offset, count) for each piece of [begin, end): one empty piece for
/// an empty range, so that every round of every operation carries a message
/// (and no member can finish an operation before every member started it).
template <class F>
void for_pieces(int64_t begin, int64_t end, int64_t piece, F f) {
  if (begin == end) {
    f(begin, int64_t{0});
    return;
  }
  for (int64_t o = begin; o < end; o += piece) f(o, std::min(piece, end - o));
}

/// Chunk c of n elements cut into `parts`: sizes differ by at most one.
int64_t chunk_begin(int64_t n, int32_t parts, int32_t c) { return c * (n / parts) + std::min<int64_t>(c, n % parts); }

/// Ring allreduce at rank r. Global step t = 0 .. 2N-3 receives chunk
/// r-t-1 from the left (adding it for t < N-1, the reduce-scatter; copying it
/// after, the all-gather) and forwards each piece to the right as it comes.
/// Chunk c is summed once, along the ring from rank c: ((x_c + x_c+1) + ...) + x_c-1.
program ring_program(int32_t r, int32_t n_ranks, int64_t n, int64_t piece) {
  program p;
  const int32_t left = wrap(r - 1, n_ranks), right = wrap(r + 1, n_ranks), last = 2 * n_ranks - 3;
  auto range = [&](int32_t c) { return std::make_pair(chunk_begin(n, n_ranks, c), chunk_begin(n, n_ranks, c + 1)); };
  auto [b0, e0] = range(r);
  for_pieces(b0, e0, piece, [&](int64_t o, int64_t k) { p.push_back(send_step(0, r, right, o, k)); });
  for (int32_t t = 0; t <= last; ++t) {
    const int32_t c = wrap(r - t - 1, n_ranks);
    auto [b, e] = range(c);
    for_pieces(b, e, piece, [&](int64_t o, int64_t k) {
      p.push_back(receive_step(t, c, left, o, k, t < n_ranks - 1, true));
      if (t < last) p.push_back(send_step(t + 1, c, right, o, k));
    });
  }
  return p;
}

/// Recursive doubling at rank r for any N: with P the largest power of two
/// <= N and E = N - P, rank 2i (i < E) gives its buffer to rank 2i+1 (round 0)
/// and gets the result back (round L+1); the P others exchange whole buffers
/// with the partner at distance 2^(k-1) of their virtual rank in rounds 1..L,
/// each pair summing lower virtual rank first, so both get the same bits.
program doubling_program(int32_t r, int32_t n_ranks, int64_t n, int64_t piece) {
  int32_t pow2 = 1, levels = 0;
  while (pow2 * 2 <= n_ranks) pow2 *= 2, ++levels;
  const int32_t extra = n_ranks - pow2, unfold = levels + 1;
  program p;
  if (r < 2 * extra && r % 2 == 0) {
    for_pieces(0, n, piece, [&](int64_t o, int64_t k) { p.push_back(send_step(0, 0, r + 1, o, k)); });
    for_pieces(0, n, piece, [&](int64_t o, int64_t k) { p.push_back(receive_step(unfold, 0, r + 1, o, k, false, false)); });
    return p;
  }
  const bool folds = r < 2 * extra;
  const int32_t v = folds ? r / 2 : r - extra;
  auto real = [&](int32_t u) { return u < extra ? 2 * u + 1 : u + extra; };
  for_pieces(0, n, piece, [&](int64_t o, int64_t k) {
    if (folds) p.push_back(receive_step(0, 0, r - 1, o, k, true, true));
    p.push_back(send_step(1, 0, real(v ^ 1), o, k));
  });
  for (int32_t level = 1; level <= levels; ++level) {
    const int32_t u = v ^ (1 << (level - 1));
    for_pieces(0, n, piece, [&](int64_t o, int64_t k) {
      p.push_back(receive_step(level, 0, real(u), o, k, true, u < v));
      if (level < levels) p.push_back(send_step(level + 1, 0, real(v ^ (1 << level)), o, k));
      else if (folds) p.push_back(send_step(unfold, 0, r - 1, o, k));
    });
  }
  return p;
}

/// Broadcast at rank r: each piece from the parent, then on to the children;
/// ranks relative to the root. A chain (parent rel-1), or a binomial tree
/// (parent: rel less its lowest set bit; children: rel + 2^k below that bit).
program broadcast_program(int32_t r, int32_t n_ranks, int32_t root, int64_t n, int64_t piece, bool tree) {
  const int32_t rel = wrap(r - root, n_ranks);
  int32_t parent = -1;
  std::vector<int32_t> children;
  if (tree) {
    int32_t low = rel & -rel;
    if (rel == 0)
      for (low = 1; low < n_ranks;) low *= 2;
    else
      parent = rel - low;
    for (int32_t b = low / 2; b >= 1; b /= 2)
      if (rel + b < n_ranks) children.push_back(rel + b);
  } else {
    if (rel > 0) parent = rel - 1;
    if (rel + 1 < n_ranks) children.push_back(rel + 1);
  }
  program p;
  for_pieces(0, n, piece, [&](int64_t o, int64_t k) {
    if (parent >= 0) p.push_back(receive_step(0, 0, wrap(parent + root, n_ranks), o, k, false, false));
    for (int32_t c : children) p.push_back(send_step(0, 0, wrap(c + root, n_ranks), o, k));
  });
  return p;
}

/// Dissemination barrier: in round k, a message to rank r + 2^k, then one from r - 2^k.
program barrier_program(int32_t r, int32_t n_ranks) {
  program p;
  int32_t k = 0;
  for (int64_t d = 1; d < n_ranks; d *= 2, ++k) {
    p.push_back(send_step(k, 0, wrap(r + d, n_ranks), 0, 0));
    p.push_back(receive_step(k, 0, wrap(r - d, n_ranks), 0, 0, false, false));
  }
  return p;
}

int32_t rounds_of(const program& p) {
  int32_t rounds = 0;
  for (const step& s : p) rounds = std::max(rounds, s.round + 1);
  return rounds;
}

std::string describe(const collective_message& m) {
  return "collective message of member " + std::to_string(m.sender) + " (epoch " + std::to_string(m.epoch) +
         ", op " + std::to_string(m.op) + ", round " + std::to_string(m.round) + ", chunk " +
         std::to_string(m.chunk) + ", offset " + std::to_string(m.offset) + ")";
}

} // namespace

const char* to_string(collective_algorithm a) {
  switch (a) {
    case collective_algorithm::none: return "none";
    case collective_algorithm::ring: return "ring";
    case collective_algorithm::recursive_doubling: return "recursive doubling";
    case collective_algorithm::chain: return "chain";
    case collective_algorithm::binomial_tree: return "binomial tree";
    case collective_algorithm::dissemination: return "dissemination";
  }
  return "?";
}

const char* to_string(collective_reject r) {
  static const char* const names[collective_reject_count] = {
      "wrong epoch", "not a member", "wrong receiver", "stale operation", "operation too far ahead", "wrong kind",
      "wrong round", "wrong chunk",  "wrong piece",    "wrong payload",   "duplicate"};
  const auto i = static_cast<std::size_t>(r);
  return i < collective_reject_count ? names[i] : "?";
}

uint64_t collective_stats::total_rejected() const {
  uint64_t t = 0;
  for (uint64_t x : rejected) t += x;
  return t;
}

uint16_t to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN: stays quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float from_bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

collective_core::collective_core(std::vector<int32_t> members, int32_t self, uint64_t epoch, collective_options o)
    : members_(std::move(members)), self_(self), epoch_(epoch), opt_(o) {
  if (members_.empty()) throw error("collective: a group needs at least one member");
  for (std::size_t i = 0; i < members_.size(); ++i)
    if (!ranks_.emplace(members_[i], static_cast<int32_t>(i)).second)
      throw error("collective: member " + std::to_string(members_[i]) + " is listed twice in the group");
  rank_ = rank_of(self);
  if (rank_ < 0) throw error("collective: member " + std::to_string(self) + " is not in its own group");
  if (opt_.piece_elements < 1)
    throw error("collective: piece_elements is " + std::to_string(opt_.piece_elements) + ", it must be at least 1");
  if (opt_.small_threshold_bytes < 0) throw error("collective: small_threshold_bytes must not be negative");
}

int32_t collective_core::rank_of(int32_t id) const {
  auto it = ranks_.find(id);
  return it == ranks_.end() ? -1 : it->second;
}

collective_algorithm collective_core::allreduce_algorithm(int64_t n) const {
  if (size() == 1) return collective_algorithm::none;
  // n * 4 < threshold, without overflow.
  const int64_t t = opt_.small_threshold_bytes, f = static_cast<int64_t>(sizeof(float));
  return n < t / f + (t % f != 0 ? 1 : 0) ? collective_algorithm::recursive_doubling : collective_algorithm::ring;
}

void collective_core::require_startable(uint64_t op, int64_t n, const float* buffer, const char* what) const {
  const std::string who = "collective member " + std::to_string(self_) + ": " + what + " op " + std::to_string(op);
  if (active_)
    throw error(who + " started while op " + std::to_string(op_) + " is under way: start the next after done()");
  if (op != next_op_)
    throw error(who + ", expected op " + std::to_string(next_op_) +
                ": every member numbers its operations 0, 1, 2, ... in the group's epoch, in the same order");
  if (n < 0) throw error(who + ": a buffer of " + std::to_string(n) + " elements");
  if (n > 0 && buffer == nullptr) throw error(who + ": no buffer for " + std::to_string(n) + " elements");
}

std::vector<collective_message> collective_core::start_allreduce(uint64_t op, float* buffer, int64_t n) {
  require_startable(op, n, buffer, "allreduce");
  const collective_algorithm a = allreduce_algorithm(n);
  program p;
  if (a == collective_algorithm::ring) p = ring_program(rank_, size(), n, opt_.piece_elements);
  if (a == collective_algorithm::recursive_doubling) p = doubling_program(rank_, size(), n, opt_.piece_elements);
  return begin(op, collective_kind::allreduce, a, std::move(p), buffer, n);
}

std::vector<collective_message> collective_core::start_broadcast(uint64_t op, int32_t root, float* buffer, int64_t n) {
  require_startable(op, n, buffer, "broadcast");
  const int32_t root_rank = rank_of(root);
  if (root_rank < 0) throw error("collective: broadcast from " + std::to_string(root) + ", not a member of the group");
  const bool tree = allreduce_algorithm(n) == collective_algorithm::recursive_doubling;
  collective_algorithm a = size() == 1 ? collective_algorithm::none
                           : tree      ? collective_algorithm::binomial_tree
                                       : collective_algorithm::chain;
  return begin(op, collective_kind::broadcast, a,
               broadcast_program(rank_, size(), root_rank, n, opt_.piece_elements, tree), buffer, n);
}

std::vector<collective_message> collective_core::start_barrier(uint64_t op) {
  require_startable(op, 0, nullptr, "barrier");
  const collective_algorithm a = size() == 1 ? collective_algorithm::none : collective_algorithm::dissemination;
  return begin(op, collective_kind::barrier, a, barrier_program(rank_, size()), nullptr, 0);
}

std::vector<collective_message> collective_core::begin(uint64_t op, collective_kind kind, collective_algorithm a,
                                                       program p, float* buffer, int64_t n) {
  active_ = true;
  op_ = op;
  next_op_ = op + 1;
  kind_ = kind;
  algorithm_ = a;
  buf_ = buffer;
  n_ = n;
  program_ = std::move(p);
  rounds_ = rounds_of(program_);
  cursor_ = 0;
  slots_.assign(program_.size(), slot::pending);
  kept_.clear();
  receives_.clear();
  round_chunk_.clear();
  for (std::size_t i = 0; i < program_.size(); ++i) {
    const step& s = program_[i];
    if (s.send) continue;
    receives_[{s.peer, s.round, s.offset}] = i;
    round_chunk_[{s.peer, s.round}] = s.chunk;
  }
  std::vector<collective_message> out;
  run(out);
  // The pieces of this operation that came before it started, in the order they came.
  std::vector<collective_message> early;
  auto mine = std::stable_partition(early_.begin(), early_.end(),
                                    [&](const collective_message& m) { return m.op != op; });
  std::move(mine, early_.end(), std::back_inserter(early));
  early_.erase(mine, early_.end());
  for (const collective_message& m : early) {
    if (active_ && m.op == op_) take(m, out);
    else reject(collective_reject::stale_op, m, "op " + std::to_string(m.op) + " is finished");
  }
  return out;
}

void collective_core::run(std::vector<collective_message>& out) {
  while (cursor_ < program_.size()) {
    const step& s = program_[cursor_];
    if (s.send) {
      out.push_back(make(s));
    } else {
      auto it = kept_.find(cursor_);
      if (it == kept_.end()) return;
      apply(s, it->second, out);
      kept_.erase(it);
    }
    slots_[cursor_] = slot::taken;
    ++cursor_;
  }
  finish();
}

void collective_core::finish() {
  // bf16: every member ends with bf16 values. Recursive doubling's folded
  // members get the result rounded, the others hold it in float32: rounding
  // theirs too gives every member the same bits (a ring's are already bf16).
  if (opt_.payload == collective_payload::bf16 && kind_ == collective_kind::allreduce &&
      algorithm_ != collective_algorithm::none)
    for (int64_t i = 0; i < n_; ++i) buf_[i] = from_bf16(to_bf16(buf_[i]));
  active_ = false;
  buf_ = nullptr;
  program_.clear();
  slots_.clear();
  receives_.clear();
  round_chunk_.clear();
}

collective_message collective_core::make(const step& s) {
  collective_message m;
  m.epoch = epoch_;
  m.op = op_;
  m.kind = kind_;
  m.round = s.round;
  m.chunk = s.chunk;
  m.offset = s.offset;
  m.sender = self_;
  m.receiver = members_[static_cast<std::size_t>(s.peer)];
  if (s.count == 0) return m;
  float* src = buf_ + s.offset;
  if (opt_.payload == collective_payload::f32) {
    if (opt_.send_views) {
      m.view = src;
      m.view_count = s.count;
    } else {
      m.data.assign(src, src + s.count);
    }
    return m;
  }
  // What is sent is rounded here too, so that sender and receiver sum the same operands.
  m.bf16.resize(static_cast<std::size_t>(s.count));
  for (int64_t i = 0; i < s.count; ++i) {
    m.bf16[static_cast<std::size_t>(i)] = to_bf16(src[i]);
    src[i] = from_bf16(m.bf16[static_cast<std::size_t>(i)]);
  }
  return m;
}

void collective_core::apply(const step& s, const collective_message& m, std::vector<collective_message>& out) {
  if (s.count == 0) return;
  float* dst = buf_ + s.offset;
  // A piece this call already made may view the elements about to change: it keeps its own copy.
  for (collective_message& sent : out)
    if (sent.view != nullptr && sent.view < dst + s.count && dst < sent.view + sent.view_count) sent.own();
  const float* in = m.f32();
  if (opt_.payload == collective_payload::bf16) {
    scratch_.resize(static_cast<std::size_t>(s.count));
    for (int64_t i = 0; i < s.count; ++i) scratch_[static_cast<std::size_t>(i)] = from_bf16(m.bf16[static_cast<std::size_t>(i)]);
    in = scratch_.data();
  }
  if (!s.add)
    std::copy(in, in + s.count, dst);
  else if (s.incoming_first)
    for (int64_t i = 0; i < s.count; ++i) dst[i] = in[i] + dst[i];
  else
    for (int64_t i = 0; i < s.count; ++i) dst[i] = dst[i] + in[i];
}

void collective_core::reject(collective_reject why, const collective_message& m, const std::string& what) {
  ++stats_.rejected[static_cast<std::size_t>(why)];
  last_error_ = "collective member " + std::to_string(self_) + " rejected a " + describe(m) + ": " + to_string(why) +
                ", " + what;
}

bool collective_core::check_header(const collective_message& m) {
  if (m.epoch != epoch_) {
    reject(collective_reject::wrong_epoch, m, "the group is at epoch " + std::to_string(epoch_));
  } else if (rank_of(m.sender) < 0) {
    reject(collective_reject::not_member, m, "the sender is not in the group");
  } else if (m.receiver != self_) {
    reject(collective_reject::wrong_receiver, m, "it is meant for member " + std::to_string(m.receiver));
  } else if (m.op < next_op_ && !(active_ && m.op == op_)) {
    reject(collective_reject::stale_op, m, "op " + std::to_string(m.op) + " is finished");
  } else if (m.op >= next_op_ && m.op - next_op_ >= opt_.ops_ahead) {
    reject(collective_reject::future_op, m,
           "the next op to start is " + std::to_string(next_op_) + " and " + std::to_string(opt_.ops_ahead) +
               " op(s) ahead are kept");
  } else {
    return true;
  }
  return false;
}

int64_t collective_core::find_step(const collective_message& m) {
  const int32_t peer = rank_of(m.sender);
  const auto in_round = round_chunk_.find({peer, m.round});
  const std::size_t want = opt_.payload == collective_payload::f32 ? m.f32_count() : m.bf16.size();
  const std::size_t other = opt_.payload == collective_payload::f32 ? m.bf16.size() : m.f32_count();
  auto it = receives_.find({peer, m.round, m.offset});
  if (m.kind != kind_) {
    reject(collective_reject::wrong_kind, m, "op " + std::to_string(op_) + " is of another kind");
  } else if (m.round < 0 || m.round >= rounds_ || in_round == round_chunk_.end()) {
    reject(collective_reject::wrong_round, m, "this op's rounds are 0 to " + std::to_string(rounds_ - 1) +
                                                  " and the sender sends nothing here in this one");
  } else if (m.chunk != in_round->second) {
    reject(collective_reject::wrong_chunk, m, "expected chunk " + std::to_string(in_round->second));
  } else if (other != 0) {
    reject(collective_reject::wrong_payload, m,
           std::string("the group's payload is ") + (opt_.payload == collective_payload::f32 ? "f32" : "bf16"));
  } else if (it == receives_.end() || want != static_cast<std::size_t>(program_[it->second].count)) {
    reject(collective_reject::wrong_piece, m,
           std::to_string(want) + " elements at an offset and size that are not a piece of this round");
  } else if (slots_[it->second] != slot::pending) {
    reject(collective_reject::duplicate, m, "this piece was already taken");
  } else {
    return static_cast<int64_t>(it->second);
  }
  return -1;
}

void collective_core::take(const collective_message& m, std::vector<collective_message>& out) {
  const int64_t i = find_step(m);
  if (i < 0) return;
  ++stats_.accepted;
  const auto at = static_cast<std::size_t>(i);
  if (at != cursor_) {
    // Before its turn: kept, and applied in program order.
    ++stats_.early;
    slots_[at] = slot::kept;
    kept_.emplace(at, m).first->second.own();
    return;
  }
  apply(program_[at], m, out);
  slots_[at] = slot::taken;
  ++cursor_;
  run(out);
}

std::vector<collective_message> collective_core::accept(const collective_message& m) {
  std::vector<collective_message> out;
  if (!check_header(m)) return out;
  if (active_ && m.op == op_) {
    take(m, out);
  } else {
    // An operation not yet started: checked and taken when it starts.
    ++stats_.ahead;
    early_.push_back(m);
    early_.back().own();
  }
  return out;
}

} // namespace troupe::actors
