#include "actors/worker_core.hpp"
#include "net/protocol.hpp"

#include <algorithm>
#include <cstring>

#include "actors/messages.hpp"
#include "kernels/kernels.hpp"
#include "model/loss.hpp"
#include "net/tensor_codec.hpp"

namespace troupe::actors {

namespace {

[[noreturn]] void reject(net::reject_reason r, const std::string& what) { throw net::message_error(r, what); }

/// A replica borrowed for one scope.
class borrowed {
public:
  explicit borrowed(replica_pool& p) : pool_(p), r_(p.acquire()) {}
  ~borrowed() { pool_.release(r_); }
  borrowed(const borrowed&) = delete;
  borrowed& operator=(const borrowed&) = delete;
  replica& operator*() { return *r_; }
  replica* operator->() { return r_; }

private:
  replica_pool& pool_;
  replica* r_;
};

/// Clips the replica's whole gradient (this step's) to global norm `clip`; 0: no clipping.
void clip_whole(const kernels::context& ctx, replica& r, float clip) {
  if (clip > 0) kernels::clip_by_global_norm(ctx, {{r.flat.grads.data(), r.flat.grads.numel()}}, clip);
}

/// Push every step, nothing copied: weights read in place from the shards'
/// Params (validated when they arrived; read-only), gradients written in place
/// into the pushes. The Params are let go when the worker pushes, so that the
/// shard can update them in place. A tensor cut across shards
/// (model::shard_cut::even) is the exception: its parts are copied from the
/// Params into the replica's own tensor, and its gradient from the replica's
/// into each part's push.
class shard_weights_source final : public weight_source {
public:
  explicit shard_weights_source(const shard_source_config& c)
      : x_(c.self, c.shards, c.layout), latest_(c.shards.size()), values_(c.shards.size(), nullptr),
        bound_(c.shards.size(), false), clip_(c.clip_grad_norm) {}
  std::vector<outgoing> start() override { return x_.pull_all(); }
  std::vector<outgoing> retry() override { return x_.missing_pulls(); }
  void on_params(const net::opened_message& m) override {
    const auto a = x_.accept(*m, &tally_, &bound_);
    report_due_ = report_due_ || a.round_done;
    if (bound_[a.holder]) return;  // a late duplicate: the step goes on with the weights it began with
    latest_[a.holder] = m;
    values_[a.holder] = a.values;
  }
  bool ready() const override { return x_.ready(); }
  void attach(const model::model& net) override {
    // The layer holding each shard's first tensor, and the shards holding each layer's tensors.
    const std::vector<std::size_t> layer_of_tensor = layer_of_each_tensor(net);
    layer_shards_.assign(net.size(), {});
    cut_.assign(x_.holders().size(), {});
    is_cut_.assign(x_.layout().size(), false);
    for (std::size_t s = 0; s < x_.holders().size(); ++s) {
      const model::shard_range& range = x_.holders()[s].range;
      for (uint32_t i = range.first; i < range.last; ++i)
        if (const model::tensor_part p = model::part_of(x_.layout(), i, range); !p.whole) {
          cut_[s].push_back({i, p});
          is_cut_[i] = true;
        }
      first_layer_.push_back(range.first < layer_of_tensor.size() ? layer_of_tensor[range.first] : 0);
      for (uint32_t i = range.first; i < range.last && i < layer_of_tensor.size(); ++i) {
        std::vector<std::size_t>& of = layer_shards_[layer_of_tensor[i]];
        if (of.empty() || of.back() != s) of.push_back(s);
      }
    }
  }
  bool has_layer(std::size_t layer) const override {
    if (layer >= layer_shards_.size()) return true;
    for (std::size_t s : layer_shards_[layer])
      if (!x_.answered(s)) return false;
    return true;
  }
  void bind(replica& r, bound_tensors& b) override {
    params_ = r.net.parameters();
    for (std::size_t s = 0; s < x_.holders().size(); ++s) {
      const model::shard_range& range = x_.holders()[s].range;
      float* grads = x_.open_push(s);
      for (uint32_t i = range.first; i < range.last; ++i) {
        if (is_cut_[i]) continue;  // written to the replica's own gradient, copied at the push
        const model::layout_entry& e = x_.layout()[i];
        b.bind(params_[i]->grad, e.dims, grads + (e.offset - range.begin));
      }
    }
    bind_arrived(r, b);
  }
  void bind_arrived(replica&, bound_tensors& b) override {
    for (std::size_t s = 0; s < x_.holders().size(); ++s) {
      if (bound_[s] || !values_[s]) continue;
      const model::shard_range& range = x_.holders()[s].range;
      for (uint32_t i = range.first; i < range.last; ++i) {
        const model::layout_entry& e = x_.layout()[i];
        if (!is_cut_[i]) b.bind_read_only(params_[i]->value, e.dims, values_[s] + (e.offset - range.begin));
      }
      for (const auto& [i, p] : cut_[s])  // the replica's own tensor, its part from this shard
        std::memcpy(params_[i]->value.data() + (p.begin - x_.layout()[i].offset), values_[s] + (p.begin - range.begin),
                    static_cast<std::size_t>(p.numel()) * sizeof(float));
      bound_[s] = true;
    }
  }
  void update(const kernels::context& ctx, replica&, uint64_t step, std::vector<outgoing>& out) override {
    for (std::size_t s = 0; s < x_.holders().size(); ++s)
      if (!x_.sent(s)) gather_cut(s);
    if (clip_ > 0) {  // the whole gradient's norm: every shard's push, written by this step's backward
      std::vector<std::pair<float*, int64_t>> parts;
      for (std::size_t s = 0; s < x_.holders().size(); ++s) parts.emplace_back(x_.open_push(s), x_.holders()[s].range.numel());
      kernels::clip_by_global_norm(ctx, parts, clip_);
    }
    x_.push(step, out);
    for (auto& m : latest_) m.reset();  // trained on: the shard may now update it in place
    std::fill(values_.begin(), values_.end(), nullptr);
    std::fill(bound_.begin(), bound_.end(), false);
  }
  /// Clipping needs the whole gradient's norm before any push.
  bool pushes_during_backward() const override { return clip_ <= 0; }
  void after_layer(std::size_t layer, uint64_t step, std::vector<outgoing>& out) override {
    for (std::size_t s = 0; s < x_.holders().size(); ++s) {
      // Backward runs from the last layer to the first: once it has passed the
      // layer of a shard's first tensor, every gradient of the shard is written.
      if (x_.sent(s) || x_.holders()[s].range.first == x_.holders()[s].range.last || first_layer_.at(s) < layer) continue;
      gather_cut(s);
      x_.push_one(s, step, out);
      latest_[s].reset();  // no layer before reads these weights
      values_[s] = nullptr;
    }
  }

private:
  /// Shard s's parts of cut tensors, from the replica's gradient into its push.
  void gather_cut(std::size_t s) {
    if (cut_[s].empty()) return;
    float* push = x_.open_push(s);
    const int64_t begin = x_.holders()[s].range.begin;
    for (const auto& [i, p] : cut_[s])
      std::memcpy(push + (p.begin - begin), params_[i]->grad.data() + (p.begin - x_.layout()[i].offset),
                  static_cast<std::size_t>(p.numel()) * sizeof(float));
  }

  param_client x_;
  std::vector<net::opened_message> latest_;
  std::vector<const float*> values_;
  std::vector<model::parameter*> params_;               // the replica's, for the step
  std::vector<std::vector<std::pair<uint32_t, model::tensor_part>>> cut_;  // per shard: its parts of cut tensors
  std::vector<bool> is_cut_;                            // per tensor: cut across shards
  std::vector<bool> bound_;                             // per shard: its weights bound for this step
  std::vector<std::size_t> first_layer_;                // per shard: the layer of its first tensor
  std::vector<std::vector<std::size_t>> layer_shards_;  // per layer: the shards holding its tensors
  float clip_;                                          // > 0: the gradient's global norm is clipped to it
};

/// k local steps with the worker's own optimizer on its own copy of the
/// parameters, then the accumulated change as a gradient at the worker's lr:
/// the server applies w <- w - eta * g, so eta = worker lr replays it.
class local_steps_source final : public weight_source {
public:
  local_steps_source(const shard_source_config& c, int k, float lr, float momentum)
      : x_(c.self, c.shards, c.layout), k_(k), lr_(lr), w_(static_cast<std::size_t>(c.layout.numel())), start_(w_.size()),
        opt_(optim::sgd(lr).momentum(momentum).make()), clip_(c.clip_grad_norm) {}
  std::vector<outgoing> start() override { return x_.pull_all(); }
  std::vector<outgoing> retry() override { return x_.missing_pulls(); }
  void on_params(const net::opened_message& m) override {
    const auto a = x_.accept(*m, &tally_);
    report_due_ = report_due_ || a.round_done;
    if (!a.first) return;  // the local steps go on from the answer that came first
    const model::shard_range& range = x_.holder(a.holder).range;
    std::memcpy(w_.data() + range.begin, a.values, range.numel() * sizeof(float));
    if (x_.ready()) start_ = w_;
  }
  bool ready() const override { return x_.ready(); }
  void bind(replica& r, bound_tensors&) override {
    std::memcpy(r.flat.values.data(), w_.data(), w_.size() * sizeof(float));
  }
  void update(const kernels::context& ctx, replica& r, uint64_t step, std::vector<outgoing>& out) override {
    clip_whole(ctx, r, clip_);
    opt_->step(ctx, r.net.parameters());
    std::memcpy(w_.data(), r.flat.values.data(), w_.size() * sizeof(float));
    if (++local_ < k_) return;
    local_ = 0;
    for (std::size_t s = 0; s < x_.holders().size(); ++s) {
      const model::shard_range& range = x_.holders()[s].range;
      float* g = x_.open_push(s);
      for (int64_t j = 0; j < range.numel(); ++j) g[j] = (start_[range.begin + j] - w_[range.begin + j]) / lr_;
    }
    x_.push(step, out);
  }

private:
  param_client x_;
  int k_;
  float lr_;
  std::vector<float> w_, start_;  // the worker's parameters; and at the last pull
  std::unique_ptr<model::optimizer> opt_;
  float clip_;  // > 0: each local step's gradient clipped to this global norm
  int local_ = 0;
};

class hogwild_source final : public weight_source {
public:
  hogwild_source(std::shared_ptr<hogwild_store> store, float lr, model::lr_schedule schedule, int64_t total,
                 int64_t warmup, float clip)
      : store_(std::move(store)), lr_(lr), schedule_(schedule), total_(total), warmup_(warmup), clip_(clip) {}
  bool ready() const override { return true; }
  void bind(replica& r, bound_tensors&) override {
    seen_ = store_->updates.load(std::memory_order_relaxed);
    store_->read(r.flat.values.data());
  }
  void update(const kernels::context& ctx, replica& r, uint64_t, std::vector<outgoing>&) override {
    clip_whole(ctx, r, clip_);
    store_->subtract(model::scheduled_lr(lr_, schedule_, static_cast<int64_t>(seen_), total_, warmup_), r.flat.grads.data());
    const uint64_t before = store_->updates.fetch_add(1, std::memory_order_relaxed);
    tally_.add(before - seen_, false);
    report_due_ = true;
  }

private:
  std::shared_ptr<hogwild_store> store_;
  float lr_;
  model::lr_schedule schedule_;
  int64_t total_, warmup_;
  float clip_;
  uint64_t seen_ = 0;
};

} // namespace

// --- replicas, the Hogwild! store, bound tensors ---

replica* replica_pool::acquire() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty()) {
    auto r = std::make_unique<replica>();
    r->net = make_();
    if (!r->net.built()) throw error("replica_pool: the factory must return a built model");
    r->flat = r->net.flatten();
    all_.push_back(std::move(r));
    return all_.back().get();
  }
  replica* r = free_.back();
  free_.pop_back();
  return r;
}

void replica_pool::release(replica* r) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(r);
}

std::size_t replica_pool::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return all_.size();
}

hogwild_store::hogwild_store(const float* init, int64_t n) : w_(new std::atomic<float>[n]), n_(n) {
  for (int64_t i = 0; i < n; ++i) w_[i].store(init[i], std::memory_order_relaxed);
}

void hogwild_store::read(float* out) const {
  for (int64_t i = 0; i < n_; ++i) out[i] = w_[i].load(std::memory_order_relaxed);
}

void hogwild_store::subtract(float lr, const float* g) {
  for (int64_t i = 0; i < n_; ++i)
    w_[i].store(w_[i].load(std::memory_order_relaxed) - lr * g[i], std::memory_order_relaxed);
}

bound_tensors::~bound_tensors() {
  for (std::size_t i = 0; i < slots_.size(); ++i) *slots_[i] = std::move(own_[i]);
}

void bound_tensors::bind(tensor& slot, const shape& s, float* data) {
  slots_.push_back(&slot);
  own_.push_back(slot);
  slot = tensor::wrap(s, data);
}

void bound_tensors::bind_read_only(tensor& slot, const shape& s, const float* data) {
  slots_.push_back(&slot);
  own_.push_back(slot);
  slot = tensor::wrap_read_only(s, data);
}

// --- weight sources ---

void weight_source::on_params(const net::opened_message&) {
  reject(net::reject_reason::unknown_kind, "worker: Params, but its weights do not come from parameter shards");
}

std::vector<outgoing> weight_source::on_collective(const net::opened_message&) {
  reject(net::reject_reason::unknown_kind, "worker: a Collective, but it is not in an allreduce");
}

std::vector<std::size_t> layer_of_each_tensor(const model::model& net) {
  std::vector<std::size_t> out;
  const std::vector<int> counts = net.profile().tensors;
  for (std::size_t l = 0; l < counts.size(); ++l) out.insert(out.end(), counts[l], l);
  return out;
}

std::vector<outgoing> weight_source::on_regroup(const net::opened_message&) {
  reject(net::reject_reason::unknown_kind, "worker: a Regroup, but it is not in an allreduce");
}

std::vector<outgoing> weight_source::on_pull(const net::opened_message&) {
  reject(net::reject_reason::unknown_kind, "worker: a PullParams, but it holds no parameters to answer with");
}

staleness_tally weight_source::take_tally() {
  staleness_tally t = tally_;
  tally_ = {};
  report_due_ = false;
  return t;
}

std::unique_ptr<weight_source> shard_weights(const shard_source_config& c) {
  return std::make_unique<shard_weights_source>(c);
}

std::unique_ptr<weight_source> local_steps(const shard_source_config& c, int k, float lr, float momentum) {
  if (k < 1) throw error("--push-every must be at least 1, got " + std::to_string(k));
  return std::make_unique<local_steps_source>(c, k, lr, momentum);
}

std::unique_ptr<weight_source> hogwild_weights(std::shared_ptr<hogwild_store> store, float lr,
                                               model::lr_schedule schedule, int64_t total_updates,
                                               int64_t warmup, float clip_grad_norm) {
  return std::make_unique<hogwild_source>(std::move(store), lr, schedule, total_updates, warmup, clip_grad_norm);
}

// --- worker ---

/// A step between its batch and its pushes: paused while the weights of its
/// next layer have not come (receiving per layer).
struct worker_core::running {
  explicit running(replica_pool& p) : replica(p) {}
  borrowed replica;     // released after `bound` has given the replica its tensors back
  bound_tensors bound;
  net::opened_message batch;  // its images are read in place
  tensor x;
  std::size_t next = 0;          // the next layer to run forward
  const tensor* act = nullptr;   // the output of the layer before `next`
  bool forward_done = false;     // forward and the loss are done: backward from `back`
  double loss = 0;
  std::size_t back = 0;          // backward's next layer is back - 1; 0: done
  std::size_t parts = 0;         // of layer back - 1's parts, those still to run (0: none begun)
  const tensor* grad = nullptr;  // d(loss)/d(the output of the next part)
  bool yielded = false;          // backward let messages in: go_on() goes on
  int sent = 0;                  // pushes handed to the sender during backward
};

worker_core::worker_core(const train::worker_plan& p, std::shared_ptr<replica_pool> pool,
                         std::unique_ptr<weight_source> source)
    : p_(p), pool_(std::move(pool)), source_(std::move(source)), ctx_(kernels::context::with_threads(p.threads)) {
  borrowed r(*pool_);
  input_ = r->net.input_shape();
  source_->attach(r->net);
}

worker_core::~worker_core() = default;

bool worker_core::can_step() const { return !run_ && (receive_ ? source_->has_layer(0) : ready()); }

bool worker_core::can_resume() const { return run_ && !run_->forward_done && source_->has_layer(run_->next); }

bool worker_core::yielded() const { return run_ && run_->yielded; }

net::opened_message worker_core::open(const net::message& m) const {
  auto r = std::make_shared<const net::envelope_reader>(m, receiver_limits(ctx_));
  net::require_accepted(wire::Role::WORKER, *r, net::to_string(p_.address));
  return r;
}

worker_core::step_out worker_core::step(const net::opened_message& m) {
  if (!can_step())
    throw error(net::to_string(p_.address) + (run_ ? ": step() while a step waits for its weights"
                                                   : ": step() before its parameters arrived"));
  const net::envelope_reader& r = *m;
  if (r.root().which() != wire::Envelope::BATCH)
    reject(net::reject_reason::unknown_kind, net::to_string(p_.address) + ": expected a Batch");
  auto b = r.root().getBatch();
  net::tensor_view img = net::view(b.getImages(), "batch images");
  if (img.dims.rank() < 1 || img.dims[0] < 1) reject(net::reject_reason::wrong_shape, "batch: no images");
  const shape per_sample(std::vector<int64_t>(img.dims.dims().begin() + 1, img.dims.dims().end()));
  if (per_sample != input_)
    reject(net::reject_reason::wrong_shape,
           "batch images " + img.dims.to_string() + " do not fit the model input " + input_.to_string());
  auto labels = b.getLabels();
  labels_.resize(labels.size());
  for (unsigned i = 0; i < labels.size(); ++i) labels_[i] = labels[i];

  if (static_cast<int64_t>(b.getEpoch()) != epoch_) {
    epoch_ = b.getEpoch();
    source_->epoch_starts(b.getEpoch());
  }
  run_ = std::make_unique<running>(*pool_);
  run_->batch = m;
  run_->x = tensor::wrap_read_only(img.dims, img.data);
  source_->bind(*run_->replica, run_->bound);
  return advance();
}

worker_core::step_out worker_core::resume() {
  if (!can_resume())
    throw error(net::to_string(p_.address) + (run_ ? ": resume() before the weights of layer " +
                                                         std::to_string(run_->next) + " arrived"
                                                   : ": resume() without a paused step"));
  source_->bind_arrived(*run_->replica, run_->bound);
  return advance();
}

worker_core::step_out worker_core::go_on() {
  if (!yielded()) throw error(net::to_string(p_.address) + ": go_on() without a step that let messages in");
  run_->yielded = false;
  return advance();
}

worker_core::step_out worker_core::advance() {
  // Busy time, as the step ran (the report's compute_s): every piece of the
  // step runs here, and none of them waits for a message.
  struct busy_clock {
    double& total;
    std::chrono::steady_clock::time_point begin = std::chrono::steady_clock::now();
    ~busy_clock() { total += std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count(); }
  } clock{compute_s_};
  try {
    return advance_step();
  } catch (...) {
    run_.reset();  // a failed step is over: its replica goes back, its weights are let go
    throw;
  }
}

worker_core::step_out worker_core::advance_step() {
  running& s = *run_;
  model::model& net = s.replica->net;
  step_out out;
  if (!s.forward_done) {
    {
      train::trace_span span(trace_.get(), track_, "forward");
      for (; s.next < net.size(); ++s.next) {
        if (!source_->has_layer(s.next)) {
          out.paused = true;
          return out;
        }
        s.act = &net.forward_layer(ctx_, s.next == 0 ? s.x : *s.act, s.next, true);
      }
      s.loss = model::cross_entropy(ctx_, *s.act, labels_, &dlogits_);
    }
    s.forward_done = true;
    s.back = net.size();
    s.grad = &dlogits_;
    ++steps_;
  }
  if (!backward(s)) {
    out.yielded = s.yielded = true;
    return out;
  }
  out.loss = s.loss;
  out.sent_during_backward = s.sent;
  loss_sum_ += s.loss;
  ++loss_n_;
  samples_ += static_cast<uint64_t>(s.x.dim(0));
  {
    train::trace_span span(trace_.get(), track_, source_->pushes_during_backward() ? "push" : "update");
    source_->update(ctx_, *s.replica, steps_, out.pushes);
  }
  run_.reset();
  return out;
}

bool worker_core::backward(running& s) {
  model::model& net = s.replica->net;
  if (!send_ || !source_->pushes_during_backward()) {
    train::trace_span span(trace_.get(), track_, "backward");
    net.backward(ctx_, dlogits_);
    return true;
  }
  std::vector<outgoing> early;
  auto span = std::make_unique<train::trace_span>(trace_.get(), track_, "backward");
  while (s.back > 0) {
    const std::size_t layer = s.back - 1;
    if (s.parts == 0) s.parts = net.layer_backward_parts(layer);
    s.grad = &net.backward_part(ctx_, *s.grad, layer, --s.parts);
    // The layer is done once its last part (a transformer block has two) has run, or one that needed no input gradient.
    if (s.parts == 0 || !s.grad->defined()) {
      s.parts = 0;
      s.back = net.layer_needs_input_grad(layer) ? layer : 0;  // 0: nothing before it learns
      source_->after_layer(layer, steps_, early);
    }
    if (!early.empty()) {
      // The backward span is cut around each send: the trace shows where the pushes went out.
      span.reset();
      {
        train::trace_span push(trace_.get(), track_, "push");
        for (outgoing& o : early) {
          // A shard's index is its place in the layout: the first layers' shards go first.
          if (receive_) o.priority = static_cast<int>(o.to.index);
          send_(std::move(o));
        }
      }
      s.sent += static_cast<int>(early.size());
      early.clear();
      span = std::make_unique<train::trace_span>(trace_.get(), track_, "backward");
    }
    if (yield_ && s.back > 0 && source_->wants_messages()) return false;
  }
  return true;
}

train::step_report worker_core::report() {
  const staleness_tally t = source_->take_tally();
  train::step_report r;
  r.worker = p_.address.index;
  r.step = steps_;
  r.group = source_->group_epoch();
  r.loss = loss_n_ ? loss_sum_ / loss_n_ : 0.0;
  r.samples = samples_;
  r.compute_s = compute_s_;
  t.fill(r);
  compute_s_ = 0;
  loss_sum_ = 0;
  loss_n_ = samples_ = 0;
  return r;
}

} // namespace troupe::actors
