#include "actors/stage_weights.hpp"

#include <cstring>

#include "actors/allreduce.hpp"
#include "actors/collective_core.hpp"

namespace troupe::actors {

namespace {

[[noreturn]] void reject(const std::string& what) { throw net::message_error(net::reject_reason::unknown_kind, what); }

/// The stage's own optimizer (momentum SGD or AdamW) on its parameters.
class own_step final : public stage_weights {
public:
  own_step(const model::flat_optimizer_options& o, int64_t n, std::string who)
      : stage_weights(std::move(who)), opt_(o, n) {}
  bool update(const kernels::context& ctx, const stage_update& u, float* g, param_holder& w,
              std::vector<outgoing>&) override {
    opt_.step(ctx, w.writable(), g, u.step, u.before);
    w.bump();
    return true;
  }
  std::vector<named_tensor> state() const override {
    if (!opt_.has_state()) return {};
    return {{opt_.state_name(), tensor::from(shape{static_cast<int64_t>(opt_.state().size())}, opt_.state())}};
  }
  void restore(const std::vector<named_tensor>& state) override {
    for (const named_tensor& t : state)
      if (t.name == opt_.state_name()) opt_.restore(t.value.data(), t.value.numel(), who_);
  }

private:
  model::flat_optimizer opt_;
};

/// A hybrid on shards: pushes to the shard, takes its answer as the new weights.
class shard_step final : public stage_weights {
public:
  shard_step(const net::address& self, const net::address& shard, const model::shard_range& range, int stage,
             const model::param_layout& layout)
      : stage_weights(net::to_string(self)), client_(self, {{shard, range, {}, stage}}, layout), n_(range.numel()) {
    client_.ignore_stale_answers();
  }
  std::vector<outgoing> start() override {
    if (started_) return {};
    started_ = awaiting_ = true;
    return client_.pull_all();
  }
  bool update(const kernels::context&, const stage_update& u, float* g, param_holder&, std::vector<outgoing>& out) override {
    // One PushGradient, rewritten in place once the transport has let go of the last one (as a worker's).
    std::memcpy(client_.open_push(0), g, static_cast<std::size_t>(n_) * sizeof(float));
    client_.push_one(0, static_cast<uint64_t>(u.step + 1), out);
    awaiting_ = true;
    return false;
  }
  taken take(const net::envelope_reader& r, param_holder& w, std::vector<outgoing>& out) override {
    if (r.root().which() != wire::Envelope::PARAMS) return stage_weights::take(r, w, out);
    const param_client::accepted a = client_.accept(r, &tally_);
    // A late second answer, or a duplicate: the weights it has are as new.
    if (!a.first || !awaiting_) return taken::nothing;
    w.assign(a.values);
    awaiting_ = false;
    return taken::applied;
  }
  bool waiting() const override { return awaiting_; }

private:
  param_client client_;
  int64_t n_;
  bool started_ = false, awaiting_ = false;
};

/// A hybrid by allreduce: the mean over the replicas' stage k, then the own step.
class allreduce_step final : public stage_weights {
public:
  allreduce_step(const model::flat_optimizer_options& o, int64_t n, const std::vector<net::address>& peers,
                 int32_t member)
      : stage_weights(net::to_string(peers.at(static_cast<std::size_t>(member)))), own_(o, n, who_), peers_(peers),
        member_(member),
        n_(n) {
    std::vector<int32_t> ids(peers.size());
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
    group_ = std::make_unique<collective_core>(ids, member, 0, collective_options().views());
  }
  bool reduce(const kernels::context&, float* g, std::vector<outgoing>& out) override {
    g_ = g;
    reducing_ = true;
    send_collective(group_->start_allreduce(group_->next_op(), g, n_), self(), peers_, out);
    return group_->done() && finish();
  }
  bool update(const kernels::context& ctx, const stage_update& u, float* g, param_holder& w,
              std::vector<outgoing>& out) override {
    return own_.update(ctx, u, g, w, out);
  }
  taken take(const net::envelope_reader& r, param_holder& w, std::vector<outgoing>& out) override {
    if (r.root().which() != wire::Envelope::COLLECTIVE) return stage_weights::take(r, w, out);
    accept_piece(*group_, view_from_wire(r), self(), peers_, out, who_ + ": ");
    return reducing_ && group_->done() && finish() ? taken::reduced : taken::nothing;
  }
  bool waiting() const override { return reducing_; }
  std::vector<named_tensor> state() const override { return own_.state(); }
  void restore(const std::vector<named_tensor>& state) override { own_.restore(state); }

private:
  const net::address& self() const { return peers_[static_cast<std::size_t>(member_)]; }
  /// The sum over the replicas is in: their mean.
  bool finish() {
    const float inv = 1.0f / static_cast<float>(peers_.size());
    for (int64_t i = 0; i < n_; ++i) g_[i] *= inv;
    reducing_ = false;
    return true;
  }

  own_step own_;
  std::vector<net::address> peers_;
  int32_t member_;
  int64_t n_;
  std::unique_ptr<collective_core> group_;
  float* g_ = nullptr;
  bool reducing_ = false;
};

} // namespace

stage_weights::taken stage_weights::take(const net::envelope_reader& r, param_holder&, std::vector<outgoing>&) {
  reject(who_ + (r.root().which() == wire::Envelope::PARAMS ? ": Params for a stage without a shard"
                                                            : ": a Collective for a stage in no allreduce"));
}

staleness_tally stage_weights::take_tally() {
  staleness_tally t = tally_;
  tally_ = {};
  return t;
}

std::unique_ptr<stage_weights> own_stage_weights(const model::flat_optimizer_options& o, int64_t n, std::string who) {
  return std::make_unique<own_step>(o, n, std::move(who));
}

std::unique_ptr<stage_weights> shard_stage_weights(const net::address& self, const net::address& shard,
                                                   const model::shard_range& range, int stage,
                                                   const model::param_layout& layout) {
  return std::make_unique<shard_step>(self, shard, range, stage, layout);
}

std::unique_ptr<stage_weights> allreduce_stage_weights(const model::flat_optimizer_options& o, int64_t n,
                                                       const std::vector<net::address>& peers, int32_t member) {
  return std::make_unique<allreduce_step>(o, n, peers, member);
}

} // namespace troupe::actors
