#include "actors/allreduce.hpp"

#include "actors/messages.hpp"

#include <algorithm>
#include <cstring>
#include <deque>
#include <utility>

#include "kernels/kernels.hpp"
#include "net/tensor_codec.hpp"
#include "tensor/error.hpp"

namespace troupe::actors {

net::message to_wire(const collective_message& m, const net::address& from, const net::address& to) {
  const bool bf16 = !m.bf16.empty();
  const std::size_t bytes = bf16 ? m.bf16.size() * sizeof(uint16_t) : m.f32_count() * sizeof(float);
  // A large payload goes in a segment of its own, written once (net::written_blob).
  auto b = net::make_builder(net::written_inline_bytes(bytes));
  auto c = net::init_envelope(*b, from, to).initCollective();
  c.setEpoch(m.epoch);
  c.setOp(m.op);
  c.setKind(static_cast<uint8_t>(m.kind));
  c.setRound(m.round);
  c.setChunk(m.chunk);
  c.setOffset(m.offset);
  c.setSender(m.sender);
  c.setReceiver(m.receiver);
  c.setBf16(bf16);
  std::shared_ptr<const void> keep;
  std::byte* payload = net::written_blob(
      *b, bytes, keep, [&](std::size_t n) { return c.initPayload(static_cast<unsigned>(n)); },
      [&](capnp::Orphan<capnp::Data>&& o) { c.adoptPayload(kj::mv(o)); });
  if (bytes > 0) std::memcpy(payload, bf16 ? static_cast<const void*>(m.bf16.data()) : m.f32(), bytes);
  return net::message::from_builder(std::move(b), std::move(keep));
}

void send_collective(const std::vector<collective_message>& msgs, const net::address& from,
                     const std::vector<net::address>& members, std::vector<outgoing>& out) {
  for (const collective_message& m : msgs) {
    const net::address& to = members.at(static_cast<std::size_t>(m.receiver));
    out.push_back({to, to_wire(m, from, to)});
  }
}

collective_message view_from_wire(const net::envelope_reader& r) {
  if (r.root().which() != wire::Envelope::COLLECTIVE)
    throw net::message_error(net::reject_reason::unknown_kind, "expected a Collective");
  auto c = r.root().getCollective();
  collective_message m;
  m.epoch = c.getEpoch();
  m.op = c.getOp();
  m.kind = static_cast<collective_kind>(c.getKind());
  m.round = c.getRound();
  m.chunk = c.getChunk();
  m.offset = c.getOffset();
  m.sender = c.getSender();
  m.receiver = c.getReceiver();
  const auto payload = c.getPayload();  // whole elements: checked when the message was opened
  if (c.getBf16()) {
    m.bf16.resize(payload.size() / sizeof(uint16_t));
    if (!m.bf16.empty()) std::memcpy(m.bf16.data(), payload.begin(), payload.size());
  } else if (payload.size() > 0) {
    // The frame's segments are 8-byte aligned and a Data field starts on a word.
    m.view = reinterpret_cast<const float*>(payload.begin());
    m.view_count = static_cast<int64_t>(payload.size() / sizeof(float));
  }
  return m;
}

collective_message from_wire(const net::envelope_reader& r) {
  collective_message m = view_from_wire(r);
  m.own();
  return m;
}

void accept_piece(collective_core& group, const collective_message& in, const net::address& self,
                  const std::vector<net::address>& members, std::vector<outgoing>& out, const std::string& who) {
  const collective_stats before = group.stats();
  send_collective(group.accept(in), self, members, out);
  const collective_stats& after = group.stats();
  const uint64_t harmless = (after.get(collective_reject::duplicate) - before.get(collective_reject::duplicate)) +
                            (after.get(collective_reject::stale_op) - before.get(collective_reject::stale_op));
  if (after.total_rejected() - before.total_rejected() > harmless)
    throw net::message_error(net::reject_reason::malformed, who + group.last_error());
}

net::message make_regroup(const net::address& from, const net::address& to, const regroup& g) {
  auto b = net::make_builder();
  auto r = net::init_envelope(*b, from, to).initRegroup();
  r.setEpoch(g.epoch);
  r.setPhase(g.phase);
  r.setStep(g.step);
  r.setRoot(g.root);
  r.setReports(g.reports);
  auto members = r.initMembers(static_cast<unsigned>(g.members.size()));
  for (unsigned i = 0; i < members.size(); ++i) members.set(i, g.members[i]);
  auto joiners = r.initJoiners(static_cast<unsigned>(g.joiners.size()));
  for (unsigned i = 0; i < joiners.size(); ++i) joiners.set(i, g.joiners[i]);
  return net::message::from_builder(std::move(b));
}

regroup read_regroup(const net::envelope_reader& m) {
  if (m.root().which() != wire::Envelope::REGROUP)
    throw net::message_error(net::reject_reason::unknown_kind, "expected a Regroup");
  auto r = m.root().getRegroup();
  regroup g;
  g.epoch = r.getEpoch();
  g.phase = r.getPhase();
  g.step = r.getStep();
  g.root = r.getRoot();
  g.reports = r.getReports();
  for (uint32_t x : r.getMembers()) g.members.push_back(x);
  for (uint32_t x : r.getJoiners()) g.joiners.push_back(x);
  return g;
}

namespace {

/// A contiguous range of the flat gradient, reduced by one operation; the
/// layer of its first tensor: once backward has passed it, the range is written.
struct bucket {
  int64_t begin = 0, end = 0;
  uint32_t first_tensor = 0;
  std::size_t first_layer = 0;
};

/// Buckets from the last tensor backwards (the order backward writes
/// gradients in), each of at least `least` elements but the first one's.
std::vector<bucket> cut_buckets(const model::param_layout& layout, int64_t least) {
  std::vector<bucket> out;
  const auto n = static_cast<int64_t>(layout.size());
  int64_t end = layout.numel();
  for (int64_t t = n - 1; t >= 0; --t) {
    const int64_t begin = layout[static_cast<std::size_t>(t)].offset;
    if (t > 0 && least > 0 && end - begin < least) continue;
    if (t > 0 && least <= 0) continue;  // one bucket: cut only at the first tensor
    out.push_back({begin, end, static_cast<uint32_t>(t), 0});
    end = begin;
  }
  return out;
}

class allreduce_source final : public weight_source {
public:
  explicit allreduce_source(const allreduce_config& c)
      : c_(c), w_(c.initial), g_(c.initial.size(), 0.0f), opt_(c.opt, static_cast<int64_t>(c.initial.size())),
        g_local_(c.elastic ? g_.size() : 0),
        buckets_(cut_buckets(c.layout, c.bucket_elements)), applied_(c.steps_before),
        counted_at_{c.steps_before, c.reports_before} {
    if (static_cast<int64_t>(w_.size()) != c.layout.numel())
      throw error("allreduce: " + std::to_string(w_.size()) + " initial values for a layout of " +
                  std::to_string(c.layout.numel()));
    if (!c.state.empty()) opt_.restore(c.state.data(), static_cast<int64_t>(c.state.size()), "allreduce");
    for (std::size_t i = 0; i < c.members.size(); ++i) group_.push_back(static_cast<int32_t>(i));
    new_core();
  }
  bool ready() const override { return !in_step_ && !syncing_; }
  /// The replica's own values: all there, but for a step that waits for its reduction.
  bool has_layer(std::size_t) const override { return ready() || (in_step_ && !backward_done_); }
  void attach(const model::model& net) override {
    const std::vector<std::size_t> layer_of_tensor = layer_of_each_tensor(net);
    for (bucket& b : buckets_)
      b.first_layer = b.first_tensor < layer_of_tensor.size() ? layer_of_tensor[b.first_tensor] : 0;
  }
  void bind(replica& r, bound_tensors& b) override {
    const std::vector<model::parameter*> params = r.net.parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      const model::layout_entry& e = c_.layout[i];
      b.bind_read_only(params[i]->value, e.dims, w_.data() + e.offset);
      b.bind(params[i]->grad, e.dims, g_.data() + e.offset);
    }
    filled_ = started_ = kept_ = 0;
    in_step_ = true;
    backward_done_ = false;
  }
  bool pushes_during_backward() const override { return buckets_.size() > 1; }
  /// A bucket's reduction under way: its pieces move it on, and the next bucket starts when it is over.
  bool wants_messages() const override { return active_ && !held_; }
  uint64_t group_epoch() const override { return epoch_; }
  void after_layer(std::size_t layer, uint64_t, std::vector<outgoing>& out) override {
    while (filled_ < buckets_.size() && buckets_[filled_].first_layer >= layer) ++filled_;
    start_filled(out);
  }
  void update(const kernels::context& ctx, replica&, uint64_t, std::vector<outgoing>& out) override {
    ctx_ = ctx;
    backward_done_ = true;
    filled_ = buckets_.size();
    start_filled(out);
  }
  std::vector<outgoing> on_collective(const net::opened_message& m) override {
    std::vector<outgoing> out;
    route(view_from_wire(*m), out);
    return out;
  }
  std::vector<outgoing> on_pull(const net::opened_message& m) override {
    if (!c_.holder)
      throw net::message_error(net::reject_reason::unknown_kind, name() + ": a PullParams for a worker that holds none");
    // A snapshot's pull counts the workers' reports: a member may have
    // reported the step this one is still reducing; answered once it is applied.
    // One that comes after this worker has gone past its steps: the replica
    // kept at that point (an epoch's end, --max-steps, checkpoint-every-steps)
    // when there is one, else the current one, ahead. Steps 0: the current one.
    const uint64_t steps = m->root().getPullParams().getSteps();
    if (steps > 0 && reports() > steps)
      for (const kept_replica& k : snapshots_)
        if (k.reports == steps) return {answer(*m, k.version, k.w, k.state)};
    if (reports() >= steps) return {answer(*m, applied_, w_, opt_.state())};
    pulls_.keep(steps, m);
    return {};
  }
  void epoch_starts(uint32_t) override { keep_replica(); }
  std::vector<outgoing> on_regroup(const net::opened_message& m) override {
    const regroup g = read_regroup(*m);
    std::vector<outgoing> out;
    if (g.epoch <= epoch_) return out;  // a group this worker is past
    if (g.phase == regroup::hold) {
      held_ = true;  // no reduction goes on, and no step is applied, until the new group goes
      regroup r;
      r.epoch = g.epoch;
      r.phase = regroup::report;
      r.step = applied_;
      const net::address to = net::read_address(m->root().getSource());
      out.push_back({to, make_regroup(self(), to, r)});
    } else if (g.phase == regroup::go) {
      go(g, out);
    }
    return out;
  }

private:
  const net::address& self() const { return c_.members[static_cast<std::size_t>(c_.member)]; }
  /// The collective core of the group as it is now (group_, epoch_); its pieces view the buffer.
  void new_core() {
    core_ = std::make_unique<collective_core>(group_, c_.member, epoch_, collective_options(c_.options).views());
  }
  std::string name() const { return net::to_string(self()); }
  void route(collective_message in, std::vector<outgoing>& out) {
    if (in.epoch > epoch_) {  // a group this worker has not heard of yet
      in.own();
      future_.push_back(std::move(in));
    }
    else if (in.epoch == epoch_ && !held_) take(in, out);      // else of a group that is over: dropped
  }
  /// A piece of the group's operation under way (or of the next one).
  void take(const collective_message& in, std::vector<outgoing>& out) {
    accept_piece(*core_, in, self(), c_.members, out, name() + ": allreduce: ");
    if (core_->done() && active_) operation_over(out);
  }
  void operation_over(std::vector<outgoing>& out) {
    active_ = false;
    if (broadcasting_) {
      end_broadcast();
    } else {
      ++started_;
    }
    start_filled(out);
  }
  void send(const std::vector<collective_message>& msgs, std::vector<outgoing>& out) const {
    send_collective(msgs, self(), c_.members, out);
  }
  /// Starts the next bucket's allreduce when the one before is over and backward has filled it.
  void start_filled(std::vector<outgoing>& out) {
    while (!held_ && !active_ && !syncing_ && started_ < filled_) {
      const bucket& b = buckets_[started_];
      if (c_.elastic) keep_local(started_ + 1);
      send(core_->start_allreduce(core_->next_op(), g_.data() + b.begin, b.end - b.begin), out);
      if (!core_->done()) {
        active_ = true;
        return;
      }
      ++started_;  // one member: nothing to exchange
    }
    if (!held_ && started_ == buckets_.size() && in_step_ && backward_done_) apply_step(out);
  }
  /// Keeps this worker's own gradient of buckets [kept_, upto) before they are
  /// reduced in place: a step redone in a new group reduces them again.
  void keep_local(std::size_t upto) {
    for (; kept_ < upto && kept_ < buckets_.size(); ++kept_) {
      const bucket& b = buckets_[kept_];
      std::copy(g_.begin() + b.begin, g_.begin() + b.end, g_local_.begin() + b.begin);
    }
  }
  /// Every bucket reduced: the mean gradient's step, the same on every member.
  void apply_step(std::vector<outgoing>& out) {
    if (c_.elastic) {  // a new group may roll this step back
      w_before_ = w_;
      s_before_ = opt_.state();
      std::swap(g_last_local_, g_local_);
      g_local_.resize(g_.size());
    }
    const float inv = 1.0f / static_cast<float>(group_.size());
    for (float& x : g_) x *= inv;
    opt_.step(ctx_, w_.data(), g_.data(), static_cast<int64_t>(applied_));
    ++applied_;
    const uint64_t r = reports();
    if ((c_.last_report > 0 && r == c_.last_report) || (c_.snapshot_every > 0 && r % c_.snapshot_every == 0))
      keep_replica();
    in_step_ = false;
    report_due_ = true;
    tally_.add(0, false);
    answer_due(out);
  }
  /// The kept pulls whose reports the count has reached: the replica as it is now.
  void answer_due(std::vector<outgoing>& out) {
    pulls_.answer_due(reports(),
                      [&](const net::opened_message& m) { out.push_back(answer(*m, applied_, w_, opt_.state())); });
  }
  /// The holder keeps its replica as it is now for a snapshot that may be
  /// pulled once it has gone on (the last two such points).
  void keep_replica() {
    if (!c_.holder || (!snapshots_.empty() && snapshots_.back().reports == reports())) return;
    if (snapshots_.size() == 2) snapshots_.pop_front();
    snapshots_.push_back({reports(), applied_, w_, opt_.state()});
  }
  /// The worker reports the coordinator has counted once every member has
  /// reported the steps applied here (a snapshot's PullParams.steps counts
  /// them): its count when the group went on, then one per member and step.
  uint64_t reports() const { return counted_at_.reports + (applied_ - counted_at_.steps) * group_.size(); }
  void go(const regroup& g, std::vector<outgoing>& out);
  void redo_from_local();
  void end_broadcast();
  /// The Params that answer pull `r`: `w` at `version`, with the optimizer's `state` when it asks.
  outgoing answer(const net::envelope_reader& r, uint64_t version, const std::vector<float>& w,
                  const std::vector<float>& state) const;

  allreduce_config c_;
  kept_pulls<net::opened_message> pulls_;  // the holder's: snapshots' pulls until their steps are applied here
  std::vector<float> w_, g_;      // the replica's values, its gradient (reduced in place)
  model::flat_optimizer opt_;     // its optimizer (its state: a joiner's and a checkpoint's)
  std::vector<shape> shapes_ = c_.layout.shapes(0, static_cast<uint32_t>(c_.layout.size()));
  std::vector<float> g_local_;    // the step's own gradient, kept as each bucket's reduction starts
  std::vector<float> w_before_, s_before_, g_last_local_;  // before the last step applied, and its own gradient
  std::vector<int32_t> group_;    // the members (worker indices) of the group, in rank order
  uint64_t epoch_ = 0;
  std::unique_ptr<collective_core> core_;
  std::vector<collective_message> future_;  // pieces of a group not yet formed here
  std::vector<bucket> buckets_;
  std::size_t filled_ = 0, started_ = 0, kept_ = 0;  // buckets filled by backward; reduced; kept in g_local_
  bool active_ = false;                   // an operation under way
  bool in_step_ = false;                  // a step between its bind and its optimizer step
  bool backward_done_ = false;            // its update() came: every gradient is written
  bool held_ = false;                     // a new group forms: nothing is reduced or applied
  bool syncing_ = false;                  // a joiner waiting for the group's parameters
  bool broadcasting_ = false;             // the new group's broadcast to its joiners is under way
  std::vector<float> shared_;             // the broadcast's buffer: parameters, then the optimizer's state
  uint64_t applied_ = 0;                  // global steps applied (with those before a resume)
  struct {
    uint64_t steps = 0, reports = 0;
  } counted_at_;                          // the coordinator's count of reports when `steps` were applied: the
                                          // start (a resume) or the group's go; reports() counts on from it
  uint64_t sync_step_ = 0;                // a joiner's steps once the broadcast is over
  struct kept_replica {                   // the holder's replica at a snapshot's point
    uint64_t reports = 0, version = 0;
    std::vector<float> w, state;
  };
  std::deque<kept_replica> snapshots_;    // the last two, newest last
  kernels::context ctx_;
};

/// The new group: roll a step back or redo it, take the parameters when joining, replay early pieces.
void allreduce_source::go(const regroup& g, std::vector<outgoing>& out) {
  const auto me = static_cast<uint32_t>(c_.member);
  const bool joiner = std::find(g.joiners.begin(), g.joiners.end(), me) != g.joiners.end();
  if (!c_.elastic) throw error(name() + ": allreduce: a Regroup for a group that cannot re-form (one process)");
  if (!joiner && applied_ == g.step + 1) {  // this worker applied a step the others did not: undone, redone
    w_ = w_before_;
    opt_.state() = s_before_;
    applied_ = g.step;
    g_local_ = g_last_local_;
    kept_ = buckets_.size();
    in_step_ = backward_done_ = true;
  } else if (!joiner && applied_ != g.step) {
    throw error(name() + ": allreduce: the group goes on after step " + std::to_string(g.step) +
                ", this worker has applied " + std::to_string(applied_));
  }
  epoch_ = g.epoch;
  snapshots_.clear();  // kept before a step that may be redone in the new group
  group_.assign(g.members.begin(), g.members.end());
  // The coordinator's count goes on from its own: it counted the reports of a
  // step undone here, and counts the new group's only (step_report::group).
  counted_at_ = {g.step, g.reports};
  new_core();
  held_ = active_ = false;
  if (joiner) {
    in_step_ = backward_done_ = false;  // its step in flight was on other parameters: dropped
    filled_ = started_ = kept_ = 0;
    syncing_ = true;
    sync_step_ = g.step;
  } else if (in_step_) {
    redo_from_local();
  }
  if (!g.joiners.empty()) {
    shared_.assign(w_.size() + opt_.state().size(), 0.0f);
    if (me == g.root) {
      std::copy(w_.begin(), w_.end(), shared_.begin());
      std::copy(opt_.state().begin(), opt_.state().end(), shared_.begin() + static_cast<std::ptrdiff_t>(w_.size()));
    }
    broadcasting_ = active_ = true;
    send(core_->start_broadcast(0, static_cast<int32_t>(g.root), shared_.data(), static_cast<int64_t>(shared_.size())),
         out);
    if (core_->done()) operation_over(out);
  } else {
    start_filled(out);
  }
  std::vector<collective_message> early;
  early.swap(future_);
  for (collective_message& m : early) route(std::move(m), out);
  if (!joiner) answer_due(out);  // the count went on from the coordinator's
}

/// The step in flight (or rolled back) reduced again, from this worker's own
/// gradient: the buckets whose reduction had started get it back (g_local_), the
/// others still hold it. A step still in its backward (the group re-formed while
/// it let messages in) goes on filling buckets as before.
void allreduce_source::redo_from_local() {
  for (std::size_t b = 0; b < kept_; ++b)
    std::copy(g_local_.begin() + buckets_[b].begin, g_local_.begin() + buckets_[b].end, g_.begin() + buckets_[b].begin);
  if (backward_done_) filled_ = buckets_.size();
  started_ = 0;
}

/// The joiners take the root's parameters and optimizer state; everyone goes on with the steps.
void allreduce_source::end_broadcast() {
  broadcasting_ = false;
  if (!syncing_) return;
  std::copy(shared_.begin(), shared_.begin() + static_cast<std::ptrdiff_t>(w_.size()), w_.begin());
  std::copy(shared_.begin() + static_cast<std::ptrdiff_t>(w_.size()), shared_.end(), opt_.state().begin());
  applied_ = sync_step_;
  syncing_ = false;
}

outgoing allreduce_source::answer(const net::envelope_reader& r, uint64_t version, const std::vector<float>& w,
                                  const std::vector<float>& opt_state) const {
  const net::address to = net::read_address(r.root().getSource());
  held_params h;
  h.shard = r.root().getPullParams().getShard();
  h.version = version;
  h.shapes = &shapes_;
  h.values = w.data();
  std::vector<named_tensor> state;
  if (r.root().getPullParams().getWithState() && opt_.has_state())
    state.push_back({opt_.state_name(), tensor::from(shape{static_cast<int64_t>(opt_state.size())}, opt_state)});
  h.state = &state;
  return {to, make_params(self(), to, h)};
}

} // namespace

std::unique_ptr<weight_source> allreduce_weights(const allreduce_config& c) {
  if (c.members.empty() || c.member < 0 || c.member >= static_cast<int32_t>(c.members.size()))
    throw error("allreduce: member " + std::to_string(c.member) + " of a group of " +
                std::to_string(c.members.size()));
  return std::make_unique<allreduce_source>(c);
}

} // namespace troupe::actors
