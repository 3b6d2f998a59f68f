#include "actors/stage_core.hpp"

#include "actors/allreduce.hpp"
#include "net/protocol.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "actors/messages.hpp"
#include "kernels/kernels.hpp"
#include "model/loss.hpp"
#include "model/optimizer.hpp"
#include "net/tensor_codec.hpp"

namespace troupe::actors {

namespace {

[[noreturn]] void reject(net::reject_reason r, const std::string& what) { throw net::message_error(r, what); }

/// `initial`, checked to hold the `n` parameters of the stage's range.
const float* checked(const std::vector<float>& initial, int64_t n, const std::string& who) {
  if (static_cast<int64_t>(initial.size()) != n)
    throw error(who + ": " + std::to_string(initial.size()) + " parameters for a range of " + std::to_string(n));
  return initial.data();
}

/// The strategy the config asks for: a hybrid's shard, a hybrid's allreduce, or the stage's own optimizer.
std::unique_ptr<stage_weights> weights_of(const stage_config& c) {
  const int64_t n = c.plan.params.numel();
  if (c.plan.shard >= 0) return shard_stage_weights(c.plan.address, c.shard, c.plan.params, c.index, c.layout);
  if (!c.peers.empty()) return allreduce_stage_weights(c.opt, n, c.peers, c.member);
  return own_stage_weights(c.opt, n, net::to_string(c.plan.address));
}

/// Rows [begin, end) of a batch of `n` samples for micro-batch `j` of `m`.
std::pair<int64_t, int64_t> rows(int64_t n, int64_t j, int64_t m) { return {n * j / m, n * (j + 1) / m}; }

} // namespace

stage_core::stage_core(stage_config c, model::model net, std::vector<float> initial)
    : c_(std::move(c)), net_(std::move(net)), ctx_(kernels::context::with_threads(c_.plan.threads)),
      program_(c_.schedule, c_.index, c_.stages, c_.micro_batches, c_.total_micro_batches, c_.flush_after),
      track_(net::to_string(c_.plan.address)),
      holder_(c_.plan.address, c_.plan.address.index, c_.plan.params,
              c_.layout.shapes(c_.plan.params.first, c_.plan.params.last),
              checked(initial, c_.plan.params.numel(), track_), ctx_),
      weights_(weights_of(c_)) {
  if (!net_.built()) throw error(track_ + ": the stage's model is not built");
  if (net_.layout().numel() != holder_.size())
    throw error(track_ + ": a model of " + std::to_string(net_.layout().numel()) + " parameters for a range of " +
                std::to_string(holder_.size()));
  grads_.assign(static_cast<std::size_t>(holder_.size()), 0.0f);
  call_grads_.assign(grads_.size(), 0.0f);
  // 1F1B updates once per micro-batch, GPipe once per mini-batch.
  updates_ = c_.steps_before * (c_.schedule == model::pipeline_schedule::one_f_one_b ? c_.micro_batches : 1);
  if (c_.stash > 0) stash_.push_back(holder_.hold());
  if (c_.clip_grad_norm > 0) {
    if (static_cast<int>(c_.pipeline.size()) != c_.stages)
      throw error(track_ + ": clipping needs the " + std::to_string(c_.stages) + " stages of its pipeline, got " +
                  std::to_string(c_.pipeline.size()));
    std::vector<int32_t> ids(c_.pipeline.size());
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
    norm_group_ = std::make_unique<collective_core>(ids, c_.index, 0, collective_options().views());
  }
}

std::vector<outgoing> stage_core::start() { return weights_->start(); }

net::opened_message stage_core::open(const net::message& m) const {
  auto r = std::make_shared<const net::envelope_reader>(m, receiver_limits(ctx_));
  net::require_accepted(wire::Role::STAGE, *r, track_);
  return r;
}

void stage_core::take(const net::opened_message& m) {
  const net::envelope_reader& r = *m;
  switch (r.root().which()) {
    case wire::Envelope::BATCH: {
      if (!first()) reject(net::reject_reason::unknown_kind, track_ + ": a Batch for a stage that is not the first");
      auto b = r.root().getBatch();
      input& in = batches_[static_cast<int64_t>(b.getIndex())];
      in = {m, net::view(b.getImages(), "batch images"), {}};
      for (int32_t l : b.getLabels()) in.labels.push_back(l);
      break;
    }
    case wire::Envelope::ACTIVATION: {
      if (first()) reject(net::reject_reason::unknown_kind, track_ + ": an Activation for the first stage");
      auto a = r.root().getActivation();
      input& in = activations_[static_cast<int64_t>(a.getMicroBatch())];
      in = {m, net::view(a.getTensor(), "activation"), {}};
      for (int32_t l : a.getLabels()) in.labels.push_back(l);
      break;
    }
    case wire::Envelope::GRADIENT: {
      if (last()) reject(net::reject_reason::unknown_kind, track_ + ": a Gradient for the last stage");
      auto g = r.root().getGradient();
      gradients_[static_cast<int64_t>(g.getMicroBatch())] = {m, net::view(g.getTensor(), "gradient"), {}};
      break;
    }
    case wire::Envelope::COLLECTIVE:
      if (norm_group_ && std::find(c_.pipeline.begin(), c_.pipeline.end(), net::read_address(r.root().getSource())) !=
                             c_.pipeline.end()) {
        take_norm(r);
        break;
      }
      [[fallthrough]];
    case wire::Envelope::PARAMS:
      switch (weights_->take(r, holder_, weights_out_)) {
        case stage_weights::taken::reduced: reduced(weights_out_); break;
        case stage_weights::taken::applied: updated_ = true; break;
        case stage_weights::taken::nothing: break;
      }
      break;
    default:
      reject(net::reject_reason::unknown_kind, track_ + ": unexpected message kind");
  }
}

std::vector<outgoing> stage_core::take_pull(const net::opened_message& m) {
  const net::envelope_reader& r = *m;
  if (r.root().which() != wire::Envelope::PULL_PARAMS) reject(net::reject_reason::unknown_kind, "expected PullParams");
  const uint64_t steps = r.root().getPullParams().getSteps();
  std::vector<outgoing> out;
  if (static_cast<uint64_t>(applied_mini_batches() * c_.snapshot_replicas) >= steps) out.push_back(answer_pull(r));
  else holder_.keep(steps, {net::read_address(r.root().getSource()), r.root().getPullParams().getWithState()});
  return out;
}

int64_t stage_core::applied_mini_batches() const {
  const auto v = static_cast<int64_t>(holder_.version());
  return c_.steps_before + (c_.schedule == model::pipeline_schedule::gpipe ? v : v / c_.micro_batches);
}

void stage_core::answer_due_pulls(std::vector<outgoing>& out) {
  const auto applied = static_cast<uint64_t>(applied_mini_batches() * c_.snapshot_replicas);
  holder_.answer_due(applied, [&](const param_holder::pull& p) {
    out.push_back({p.from, p.with_state ? holder_.reply_with_state(p.from, weights_->state()) : holder_.reply(p.from)});
  });
}

outgoing stage_core::answer_pull(const net::envelope_reader& r) {
  const net::address to = net::read_address(r.root().getSource());
  // A checkpoint's: the stage's own optimizer state (a hybrid on shards keeps it at its shard).
  if (r.root().getPullParams().getWithState()) return {to, holder_.reply_with_state(to, weights_->state())};
  return {to, holder_.reply(to)};
}

void stage_core::restore(const std::vector<named_tensor>& state) { weights_->restore(state); }

int64_t stage_core::needed_batch() const {
  if (!first() || done() || program_.peek().what != model::pipeline_action::kind::forward) return -1;
  const int64_t b = program_.peek().micro_batch / c_.micro_batches;
  return batches_.count(b) ? -1 : b;
}

bool stage_core::ready(const model::pipeline_action& a) const {
  using k = model::pipeline_action::kind;
  // An update (or the first weights, or the norm's sum) under way: no action
  // before it is applied (1F1B's next backward would sum into the gradient being reduced).
  if (norming_ || weights_->waiting()) return false;
  switch (a.what) {
    case k::forward:
      return first() ? batches_.count(a.micro_batch / c_.micro_batches) > 0 : activations_.count(a.micro_batch) > 0;
    case k::backward: return last() ? flight_.count(a.micro_batch) > 0 : gradients_.count(a.micro_batch) > 0;
    case k::update: return true;
  }
  return false;
}

stage_core::result stage_core::run(int max_actions) {
  result out;
  for (outgoing& o : weights_out_) out.messages.push_back(std::move(o));  // the strategy's answers to take()
  weights_out_.clear();
  if (updated_) {  // take() completed an update
    updated_ = false;
    updated(out.messages);
  }
  while (out.actions < max_actions && !done() && ready(program_.peek())) {
    ++out.actions;
    const model::pipeline_action a = program_.peek();
    program_.advance();
    out.last = a.what;
    out.last_micro_batch = a.micro_batch;
    switch (a.what) {
      case model::pipeline_action::kind::forward: forward(a.micro_batch, out); break;
      case model::pipeline_action::kind::backward: backward(a.micro_batch, out); break;
      case model::pipeline_action::kind::update: update(a.micro_batch, out); break;
    }
  }
  return out;
}

stage_core::tensor_message stage_core::start_tensor_message(wire::Envelope::Which kind, const net::address& to,
                                                           int64_t mb, const shape& s,
                                                           const std::vector<int32_t>* labels) const {
  const auto values = static_cast<std::size_t>(s.numel()) * sizeof(float);
  auto b = net::make_builder(net::written_inline_bytes(values) + (labels ? labels->size() * 4 : 0));
  auto env = net::init_envelope(*b, c_.plan.address, to);
  wire::Tensor::Builder dst = nullptr;
  if (kind == wire::Envelope::ACTIVATION) {
    auto a = env.initActivation();
    a.setMicroBatch(static_cast<uint64_t>(mb));
    a.setStage(static_cast<uint32_t>(c_.index));
    a.setVersion(holder_.version());
    dst = a.initTensor();
    if (labels) {
      auto l = a.initLabels(static_cast<unsigned>(labels->size()));
      for (unsigned i = 0; i < l.size(); ++i) l.set(i, (*labels)[i]);
    }
  } else {
    auto g = env.initGradient();
    g.setMicroBatch(static_cast<uint64_t>(mb));
    g.setStage(static_cast<uint32_t>(c_.index));
    dst = g.initTensor();
  }
  // A layer writes the whole tensor (its output, or its input's gradient): a large one need not be zero.
  std::shared_ptr<const void> keep;
  tensor payload = tensor::wrap(s, net::init_tensor(*b, s, dst, keep));
  return {std::move(b), std::move(payload), std::move(keep)};
}

model::activations stage_core::take_activations() {
  if (spare_.empty()) return net_.make_activations();
  model::activations a = std::move(spare_.back());
  spare_.pop_back();
  return a;
}

void stage_core::forward(int64_t mb, result& out) {
  train::trace_span span(c_.trace.get(), track_, "forward", mb);
  flight f;
  std::vector<int32_t> labels;
  tensor x;
  if (first()) {
    const int64_t batch = mb / c_.micro_batches;
    f.in = batches_.at(batch);
    const net::tensor_view& img = f.in.x;
    const int64_t n = img.dims[0];
    if (n < c_.micro_batches)
      throw error(track_ + ": a batch of " + std::to_string(n) + " samples for " + std::to_string(c_.micro_batches) +
                  " micro-batches (--batch-size must be at least --micro-batches)");
    const auto [lo, hi] = rows(n, mb % c_.micro_batches, c_.micro_batches);
    std::vector<int64_t> dims = img.dims.dims();
    dims[0] = hi - lo;
    const int64_t per = img.numel() / n;
    x = tensor::wrap_read_only(shape(dims), img.data + lo * per);
    const int64_t per_row = labels_per_row(img.dims, f.in.labels.size());  // a language model's: T per window (checked on arrival)
    labels.assign(f.in.labels.begin() + lo * per_row, f.in.labels.begin() + hi * per_row);
    // The last micro-batch of a mini-batch has taken its rows: the flights keep the message.
    if (mb % c_.micro_batches == c_.micro_batches - 1) {
      batches_.erase(batch);
      ++batches_taken_;
    }
  } else {
    f.in = std::move(activations_.at(mb));
    activations_.erase(mb);
    x = tensor::wrap_read_only(f.in.x.dims, f.in.x.data);
    labels = f.in.labels;
  }
  f.act = take_activations();
  f.w = holder_.hold();
  net_.bind(f.w.values, call_grads_.data());
  if (last()) {
    const tensor& y = net_.forward(ctx_, x, true, f.act);
    const double loss = model::cross_entropy(ctx_, y, labels, &f.dlogits);
    auto& l = losses_[mb / c_.micro_batches];
    l.first += loss * static_cast<double>(y.dim(0));  // a language model's loss is per token of equal windows
    l.second += y.dim(0);
  } else {
    // The last layer writes the output into the Activation's payload, which
    // the flight keeps until its backward (a layer may read its output back).
    std::vector<int64_t> dims{x.dim(0)};
    for (int64_t d : net_.output_shape().dims()) dims.push_back(d);
    tensor_message m = start_tensor_message(wire::Envelope::ACTIVATION, c_.next, mb, shape(dims), &labels);
    net_.forward(ctx_, x, true, f.act, &m.payload);
    f.sent = m.finish();
    out.messages.push_back({c_.next, f.sent});
  }
  flight_[mb] = std::move(f);
  max_in_flight_ = std::max(max_in_flight_, in_flight());
  if (in_flight() > program_.bound())
    throw error(track_ + ": " + std::to_string(in_flight()) + " micro-batches in flight, over the schedule's bound of " +
                std::to_string(program_.bound()));
}

void stage_core::backward(int64_t mb, result& out) {
  train::trace_span span(c_.trace.get(), track_, "backward", mb);
  flight& f = flight_.at(mb);
  input grad;
  tensor dy;
  if (last()) {
    dy = f.dlogits;
  } else {
    grad = std::move(gradients_.at(mb));
    gradients_.erase(mb);
    dy = tensor::wrap_read_only(grad.x.dims, grad.x.data);
  }
  net_.bind(f.w.values, call_grads_.data());
  if (first()) {
    net_.backward(ctx_, dy, f.act);
  } else {  // the first layer writes d(loss)/d(input) into the Gradient's payload
    tensor_message m = start_tensor_message(wire::Envelope::GRADIENT, c_.previous, mb, f.in.x.dims, nullptr);
    if (net_.backward(ctx_, dy, f.act, &m.payload).defined())
      out.messages.push_back({c_.previous, m.finish()});
  }
  // A micro-batch's gradient is the mean over its samples: summed weighted by
  // its samples, the update divides by all of them (GPipe: the mini-batch's mean).
  const float* g = call_grads_.data();
  const int64_t n = static_cast<int64_t>(grads_.size());
  const float samples = static_cast<float>(dy.dim(0));
  if (summed_ == 0) std::fill(grads_.begin(), grads_.end(), 0.0f);
  for (int64_t i = 0; i < n; ++i) grads_[i] += samples * g[i];
  summed_ += dy.dim(0);
  last_backward_ = mb;
  spare_.push_back(std::move(f.act));
  flight_.erase(mb);
  if (last()) {
    const int64_t batch = mb / c_.micro_batches;
    if (++done_in_batch_[batch] == c_.micro_batches) {
      const auto [loss, samples] = losses_[batch];
      train::step_report rep;
      rep.step = static_cast<uint64_t>(batch + 1);
      rep.loss = samples ? loss / static_cast<double>(samples) : 0.0;
      rep.samples = static_cast<uint64_t>(samples);
      // A hybrid: the staleness of this stage's pushes answered since the last report.
      if (const staleness_tally t = weights_->take_tally(); t.count) t.fill(rep);
      out.reports.push_back(rep);
      losses_.erase(batch);
      done_in_batch_.erase(batch);
    }
  }
}

void stage_core::update(int64_t, result& out) {
  train::trace_span span(c_.trace.get(), track_, "update");
  // A stage before the last reports its pushes' staleness itself; the last one's goes with its step reports.
  if (const staleness_tally t = last() ? staleness_tally{} : weights_->take_tally(); t.count) {
    train::step_report rep;
    rep.staleness_only = true;
    t.fill(rep);
    out.reports.push_back(rep);
  }
  // The mean gradient; the next backward starts a new sum (the next forwards wait for a pending update).
  // A stage without parameters (or samples) has applied the mini-batch too, with nothing to step.
  empty_update_ = summed_ == 0 || grads_.empty();
  if (!empty_update_) {
    const float inv = 1.0f / static_cast<float>(summed_);
    for (float& x : grads_) x *= inv;
  }
  summed_ = 0;
  step_ = c_.steps_before + last_backward_ / c_.micro_batches;
  // The strategy's reduction first (a hybrid by allreduce: the mean over the replicas), then the norm.
  if (empty_update_ || weights_->reduce(ctx_, grads_.data(), out.messages)) reduced(out.messages);
}

void stage_core::reduced(std::vector<outgoing>& out) {
  if (!norm_group_) {
    apply(out);
    return;
  }
  // The whole model's norm: this stage's square (0 without parameters), summed with the other stages'.
  const double norm =
      empty_update_ ? 0.0 : kernels::clip_by_global_norm(ctx_, {{grads_.data(), holder_.size()}}, 0);
  norm_sq_ = static_cast<float>(norm * norm);
  norming_ = true;
  send_collective(norm_group_->start_allreduce(norm_group_->next_op(), &norm_sq_, 1), c_.plan.address, c_.pipeline,
                  out);
  if (norm_group_->done()) clip_and_apply(out);
}

void stage_core::apply(std::vector<outgoing>& out) {
  const stage_update u{step_, updates_++};
  if (empty_update_) {
    holder_.bump();
    updated(out);
  } else if (weights_->update(ctx_, u, grads_.data(), holder_, out)) {
    updated(out);
  }
}

void stage_core::take_norm(const net::envelope_reader& r) {
  accept_piece(*norm_group_, view_from_wire(r), c_.plan.address, c_.pipeline, weights_out_, track_ + ": the norm's sum: ");
  if (norming_ && norm_group_->done()) clip_and_apply(weights_out_);
}

void stage_core::clip_and_apply(std::vector<outgoing>& out) {
  norming_ = false;
  const double norm = std::sqrt(static_cast<double>(norm_sq_));
  if (norm > c_.clip_grad_norm) {
    const auto scale = static_cast<float>(c_.clip_grad_norm / norm);
    for (float& g : grads_) g *= scale;
  }
  apply(out);
}

void stage_core::updated(std::vector<outgoing>& out) {
  if (c_.stash > 0) {
    // At most `stash` versions: a micro-batch whose version was dropped goes on with the oldest kept.
    stash_.push_back(holder_.hold());
    while (static_cast<int>(stash_.size()) > c_.stash) stash_.pop_front();
    for (auto& [mb, f] : flight_)
      if (f.w.version < stash_.front().version) f.w = stash_.front();
  }
  answer_due_pulls(out);
}

double device_pace::hold(model::pipeline_action::kind what, double compute) {
  using kind = model::pipeline_action::kind;
  if (!holds()) return 0;
  if (fwd_action_s_ <= 0) return (slowdown_ - 1.0f) * compute;
  if (what == kind::update) {
    behind_ += compute;  // the backward's time included it
  } else {
    const double target = what == kind::forward ? fwd_action_s_ : bwd_action_s_;
    behind_ += compute - target;  // negative: time left to hold
  }
  // At most a mini-batch's worth behind: a long stall is not made up in a burst.
  behind_ = std::min(behind_, 4.0 * (fwd_action_s_ + bwd_action_s_));
  if (behind_ >= 0) return 0;
  const double h = -behind_;
  behind_ = 0;
  return h;
}

void device_pace::ended_late(double overshoot) {
  if (fwd_action_s_ > 0 && overshoot > 0) behind_ += overshoot;
}

} // namespace troupe::actors
