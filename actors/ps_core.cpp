#include "actors/ps_core.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <ostream>

#include "kernels/kernels.hpp"
#include "model/optimizer.hpp"
#include "net/tensor_codec.hpp"
#include "tensor/error.hpp"

namespace troupe::actors {

namespace {

std::unique_ptr<capnp::MallocMessageBuilder> builder(std::size_t payload_bytes = 0) {
  return net::make_builder(payload_bytes);
}

wire::Envelope::Builder envelope(capnp::MallocMessageBuilder& b, uint32_t sender) {
  auto env = b.initRoot<wire::Envelope>();
  env.setSchemaVersion(wire::SCHEMA_VERSION);
  env.setSender(sender);
  return env;
}

/// Readers of our own peers' messages: parameters and batches can be large.
net::reader_limits peer_limits() {
  net::reader_limits l;
  l.max_bytes = uint64_t(1) << 30;
  return l;
}

[[noreturn]] void reject(net::reject_reason r, const std::string& what) { throw net::message_error(r, what); }

} // namespace

shard_plan plan_shards(const std::vector<int64_t>& sizes, int shards) {
  const int n = static_cast<int>(sizes.size());
  if (shards < 1) throw error("--shards must be at least 1, got " + std::to_string(shards));
  if (shards > n)
    throw error("--shards " + std::to_string(shards) + " exceeds the model's " + std::to_string(n) +
                " parameter tensors (a shard holds whole tensors)");
  shard_plan p;
  p.shards = shards;
  p.owner.assign(n, -1);
  p.members.resize(shards);
  p.elements.assign(shards, 0);
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return sizes[a] > sizes[b]; });
  for (int i : order) {
    // Least loaded shard; among equals the one with fewest tensors, so that no shard stays empty.
    int best = 0;
    for (int s = 1; s < shards; ++s) {
      bool fewer = p.elements[s] < p.elements[best] ||
                   (p.elements[s] == p.elements[best] && p.members[s].size() < p.members[best].size());
      if (fewer) best = s;
    }
    p.owner[i] = best;
    p.elements[best] += sizes[i];
    p.members[best].push_back(i);
  }
  for (auto& m : p.members) std::sort(m.begin(), m.end());
  return p;
}

net::message make_pull(uint32_t sender, uint32_t shard, bool with_state) {
  auto b = builder();
  auto p = envelope(*b, sender).initPullParams();
  p.setWorker(sender);
  p.setShard(shard);
  p.setWithState(with_state);
  return net::message::from_builder(std::move(b));
}

net::message make_control(uint32_t sender, wire::Control::Kind kind, uint32_t amount, const std::string& detail) {
  auto b = builder(detail.size());
  auto c = envelope(*b, sender).initControl();
  c.setKind(kind);
  c.setAmount(amount);
  c.setDetail(detail);
  return net::message::from_builder(std::move(b));
}

net::message make_metrics(const step_report& r) {
  auto b = builder();
  auto m = envelope(*b, r.worker).initMetrics();
  m.setWorker(r.worker);
  m.setStep(r.step);
  m.setLoss(r.loss);
  m.setSamples(r.samples);
  m.setMeanStaleness(r.mean_staleness);
  m.setMaxStaleness(r.max_staleness);
  m.setRejected(r.rejected);
  return net::message::from_builder(std::move(b));
}

step_report read_metrics(wire::Metrics::Reader m, uint32_t sender) {
  step_report r;
  r.worker = m.getWorker();
  if (r.worker != sender) reject(net::reject_reason::malformed, "metrics: worker id differs from the sender's");
  r.step = m.getStep();
  r.loss = m.getLoss();
  r.samples = m.getSamples();
  r.mean_staleness = m.getMeanStaleness();
  r.max_staleness = m.getMaxStaleness();
  r.rejected = m.getRejected();
  if (!std::isfinite(r.loss) || !std::isfinite(r.mean_staleness))
    reject(net::reject_reason::non_finite, "metrics: non-finite loss or staleness");
  return r;
}

uint32_t check_shard_params(wire::Params::Reader p, const shard_plan& plan, const std::vector<tensor*>& like) {
  const uint32_t s = p.getShard();
  if (s >= static_cast<uint32_t>(plan.shards)) reject(net::reject_reason::wrong_shape, "params: no shard " + std::to_string(s));
  std::vector<shape> expected;
  for (int i : plan.members[s]) expected.push_back(like.at(i)->shape());
  net::require_shapes(p.getTensors(), expected, "params of shard " + std::to_string(s));
  return s;
}

uint32_t copy_shard_params(wire::Params::Reader p, const shard_plan& plan, const std::vector<tensor*>& into) {
  const uint32_t s = check_shard_params(p, plan, into);
  const auto& members = plan.members[s];
  auto list = p.getTensors();
  for (std::size_t j = 0; j < members.size(); ++j) {
    net::tensor_view v = net::view(list[static_cast<unsigned>(j)], "params");
    std::memcpy(into[members[j]]->data(), v.data, v.numel() * sizeof(float));
  }
  return s;
}

// --- loader ---

loader_core::loader_core(const data::image_dataset& ds, const data::normalization& norm, int64_t batch_size,
                         uint64_t seed, int64_t begin, int64_t end, uint32_t id, int first_epoch)
    : batches_(ds, batch_size, norm, seed, true, begin, end), sample_{ds.channels, ds.height, ds.width}, id_(id),
      epoch_(first_epoch) {
  batches_.start_epoch(epoch_);
}

net::message loader_core::next() {
  if (batches_.next_size() == 0) {
    batches_.start_epoch(++epoch_);
    if (batches_.next_size() == 0) throw error("data loader " + std::to_string(id_) + ": its shard is empty");
  }
  const shape s{batches_.next_size(), sample_[0], sample_[1], sample_[2]};
  auto b = builder(s.numel() * sizeof(float) + s[0] * 4);
  auto batch = envelope(*b, id_).initBatch();
  batch.setEpoch(static_cast<uint32_t>(epoch_));
  batch.setIndex(index_++);
  // The images are made straight into the message's payload.
  tmp_.images = tensor::wrap(s, net::init_tensor(s, batch.initImages()));
  const bool made = batches_.next(tmp_);
  tmp_.images = tensor();
  if (!made) throw error("data loader " + std::to_string(id_) + ": no batch where one was due");
  auto labels = batch.initLabels(static_cast<unsigned>(tmp_.labels.size()));
  for (unsigned i = 0; i < labels.size(); ++i) labels.set(i, tmp_.labels[i]);
  return net::message::from_builder(std::move(b));
}

// --- worker ---

model::model* replica_pool::acquire() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty()) {
    all_.push_back(std::make_unique<model::model>(make_()));
    if (!all_.back()->built()) throw error("replica_pool: the factory must return a built model");
    return all_.back().get();
  }
  model::model* m = free_.back();
  free_.pop_back();
  return m;
}

void replica_pool::release(model::model* m) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(m);
}

std::size_t replica_pool::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return all_.size();
}

namespace {

/// A replica borrowed for one scope.
class borrowed {
public:
  explicit borrowed(replica_pool& p) : pool_(p), m_(p.acquire()) {}
  ~borrowed() { pool_.release(m_); }
  borrowed(const borrowed&) = delete;
  borrowed& operator=(const borrowed&) = delete;
  model::model& operator*() { return *m_; }

private:
  replica_pool& pool_;
  model::model* m_;
};

/// Points a replica's parameters (values or gradients) at memory it does not
/// own for one step, and gives them their own tensors back at the end.
class bound_tensors {
public:
  ~bound_tensors() {
    for (std::size_t i = 0; i < slots_.size(); ++i) *slots_[i] = std::move(own_[i]);
  }
  void bind(tensor& slot, const shape& s, float* data) {
    slots_.push_back(&slot);
    own_.push_back(slot);
    slot = tensor::wrap(s, data);
  }

private:
  std::vector<tensor*> slots_;
  std::vector<tensor> own_;
};

} // namespace

worker_core::worker_core(std::shared_ptr<replica_pool> replicas, shard_plan plan, worker_config c)
    : pool_(std::move(replicas)), plan_(std::move(plan)), c_(std::move(c)),
      ctx_(kernels::context::with_threads(c_.threads)) {
  std::vector<model::parameter*> params;
  {
    borrowed r(*pool_);
    input_ = (*r).input_shape();
    for (auto* p : (*r).parameters()) w_.push_back(p->value.clone());
    params = (*r).parameters();
  }
  hogwild_ = c_.hogwild != nullptr;
  if (hogwild_) {
    if (c_.hogwild->params.size() != params.size()) throw error("hogwild: the shared store does not fit the model");
    for (std::size_t i = 0; i < w_.size(); ++i)
      if (static_cast<int64_t>(c_.hogwild->params[i].size()) != w_[i].numel())
        throw error("hogwild: shared tensor " + std::to_string(i) + " has the wrong size");
  } else {
    if (plan_.owner.size() != params.size()) throw error("worker: the shard plan does not fit the model");
    version_.assign(plan_.shards, 0);
    latest_.resize(plan_.shards);
    push_.resize(plan_.shards);
    shard_shapes_.resize(plan_.shards);
    for (int s = 0; s < plan_.shards; ++s)
      for (int i : plan_.members[s]) shard_shapes_[s].push_back(w_.at(i).shape());
    waiting_ = plan_.shards;  // nothing to train on before the first pull is answered
  }
  if (c_.push_every < 1) throw error("--push-every must be at least 1, got " + std::to_string(c_.push_every));
  if (c_.push_every > 1 && !hogwild_) {
    local_opt_ = optim::sgd(c_.worker_lr).momentum(c_.worker_momentum).make();
    start_.resize(w_.size());
  }
}

worker_core::~worker_core() = default;

std::vector<net::message> worker_core::pull() const {
  std::vector<net::message> out;
  for (int s = 0; s < plan_.shards; ++s) out.push_back(make_pull(c_.id, static_cast<uint32_t>(s)));
  return out;
}

bool worker_core::on_params(const net::message& m) {
  net::envelope_reader r(m, peer_limits());
  if (r.root().which() != wire::Envelope::PARAMS) reject(net::reject_reason::unknown_kind, "worker: expected Params");
  auto p = r.root().getParams();
  std::vector<tensor*> into;
  for (auto& t : w_) into.push_back(&t);
  const bool direct = !local_opt_;
  const uint32_t s = direct ? check_shard_params(p, plan_, into) : copy_shard_params(p, plan_, into);
  if (direct) latest_.at(s) = m;
  version_[s] = p.getVersion();
  if (waiting_ > 0) {
    --waiting_;
    if (steps_ > 0) accumulate_staleness(p.getAppliedStaleness(), p.getRejected());
    if (waiting_ == 0) {
      if (steps_ > 0) report_due_ = true;
      if (local_opt_)
        for (std::size_t i = 0; i < w_.size(); ++i) start_[i].assign(w_[i].data(), w_[i].data() + w_[i].numel());
    }
  }
  return waiting_ == 0;
}

void worker_core::accumulate_staleness(uint64_t tau, bool rejected) {
  tau_sum_ += tau;
  ++tau_n_;
  tau_max_ = std::max(tau_max_, tau);
  if (rejected) ++rejected_;
}

worker_core::step_out worker_core::step(const net::message& m) {
  if (!ready()) throw error("worker " + std::to_string(c_.id) + ": step() before its parameters arrived");
  net::envelope_reader r(m, peer_limits());
  if (r.root().which() != wire::Envelope::BATCH) reject(net::reject_reason::unknown_kind, "worker: expected Batch");
  auto b = r.root().getBatch();
  net::tensor_view img = net::view(b.getImages(), "batch images");
  if (img.dims.rank() < 1 || img.dims[0] < 1) reject(net::reject_reason::wrong_shape, "batch: no images");
  {
    shape per_sample(std::vector<int64_t>(img.dims.dims().begin() + 1, img.dims.dims().end()));
    if (!(per_sample == input_))
      reject(net::reject_reason::wrong_shape,
             "batch images " + img.dims.to_string() + " do not fit the model input " + input_.to_string());
  }
  kernels::ensure_shape(x_, img.dims);
  std::memcpy(x_.data(), img.data, img.numel() * sizeof(float));
  auto labels = b.getLabels();
  labels_.resize(labels.size());
  for (unsigned i = 0; i < labels.size(); ++i) labels_[i] = labels[i];

  borrowed replica(*pool_);
  const std::vector<model::parameter*> params = (*replica).parameters();
  uint64_t seen = 0;
  if (hogwild_) {
    seen = c_.hogwild->updates.load(std::memory_order_relaxed);
    for (std::size_t i = 0; i < params.size(); ++i)
      std::memcpy(params[i]->value.data(), c_.hogwild->params[i].data(), c_.hogwild->params[i].size() * sizeof(float));
  } else if (local_opt_) {
    for (std::size_t i = 0; i < params.size(); ++i)
      std::memcpy(params[i]->value.data(), w_[i].data(), w_[i].numel() * sizeof(float));
  }
  // push_every == 1: weights read in place from the shards' Params (validated
  // when they arrived; nobody writes them during a step), gradients written in
  // place into the pushes.
  bound_tensors bound;
  const bool direct = !hogwild_ && !local_opt_;
  if (direct) {
    net::reader_limits trusted = peer_limits();
    trusted.check_finite = false;
    for (int s = 0; s < plan_.shards; ++s) {
      net::envelope_reader rd(latest_[s], trusted);
      auto list = rd.root().getParams().getTensors();
      const std::vector<float*> grads = open_push(s);
      for (std::size_t j = 0; j < plan_.members[s].size(); ++j) {
        model::parameter* p = params[plan_.members[s][j]];
        const shape& sh = shard_shapes_[s][j];
        bound.bind(p->value, sh, const_cast<float*>(net::view(list[static_cast<unsigned>(j)], "params").data));
        bound.bind(p->grad, sh, grads[j]);
      }
    }
  }
  step_out out;
  const tensor& logits = (*replica).forward(ctx_, x_, true);
  out.loss = kernels::softmax_cross_entropy(ctx_, logits, labels_, &dlogits_);
  (*replica).backward(ctx_, dlogits_);
  ++steps_;
  loss_sum_ += out.loss;
  ++loss_n_;
  samples_ += labels_.size();

  if (hogwild_) {
    const float lr = model::scheduled_lr(c_.lr, c_.lr_schedule, static_cast<int64_t>(seen), c_.total_updates);
    for (std::size_t i = 0; i < params.size(); ++i) {
      float* w = c_.hogwild->params[i].data();
      const float* g = params[i]->grad.data();
      const int64_t n = params[i]->grad.numel();
      for (int64_t j = 0; j < n; ++j) w[j] -= lr * g[j];  // no lock: Hogwild!
    }
    const uint64_t before = c_.hogwild->updates.fetch_add(1, std::memory_order_relaxed);
    accumulate_staleness(before - seen, false);
    report_due_ = true;
    return out;
  }
  if (local_opt_) {
    local_opt_->step(ctx_, params);
    for (std::size_t i = 0; i < params.size(); ++i)
      std::memcpy(w_[i].data(), params[i]->value.data(), w_[i].numel() * sizeof(float));
    if (++local_steps_ < c_.push_every) return out;
    local_steps_ = 0;
    // The accumulated change, as a gradient at the worker's learning rate:
    // the server applies w <- w - eta * g, so eta = worker lr replays it.
    for (std::size_t i = 0; i < params.size(); ++i) {
      float* g = params[i]->grad.data();
      const float* w = params[i]->value.data();
      const float* w0 = start_[i].data();
      const int64_t n = params[i]->grad.numel();
      for (int64_t j = 0; j < n; ++j) g[j] = (w0[j] - w[j]) / c_.worker_lr;
    }
    for (int s = 0; s < plan_.shards; ++s) {
      const std::vector<float*> dst = open_push(s);
      for (std::size_t j = 0; j < dst.size(); ++j) {
        const tensor& g = params[plan_.members[s][j]]->grad;
        std::memcpy(dst[j], g.data(), g.numel() * sizeof(float));
      }
    }
  }
  push(out);
  return out;
}

std::vector<float*> worker_core::open_push(int s) {
  capnp::MallocMessageBuilder* b = push_[s].exclusive_builder();
  if (!b) {
    std::size_t bytes = 0;
    for (const auto& sh : shard_shapes_[s]) bytes += sh.numel() * sizeof(float) + 64;
    auto nb = builder(bytes);
    auto p = envelope(*nb, c_.id).initPushGradient();
    p.setWorker(c_.id);
    p.setShard(static_cast<uint32_t>(s));
    net::init_tensors(p.initTensors(static_cast<unsigned>(shard_shapes_[s].size())), shard_shapes_[s]);
    push_[s] = net::message::from_builder(std::move(nb));
    b = push_[s].exclusive_builder();
  }
  return net::payloads(b->getRoot<wire::Envelope>().getPushGradient().getTensors());
}

void worker_core::push(step_out& out) {
  for (int s = 0; s < plan_.shards; ++s) {
    auto p = push_[s].exclusive_builder()->getRoot<wire::Envelope>().getPushGradient();
    p.setBaseVersion(version_[s]);
    p.setStep(steps_);
    out.pushes.emplace_back(static_cast<uint32_t>(s), push_[s]);
    latest_[s] = net::message();  // trained on: the shard may now update it in place
  }
  waiting_ = plan_.shards;
}

step_report worker_core::report() {
  step_report r;
  r.worker = c_.id;
  r.step = steps_;
  r.loss = loss_n_ ? static_cast<float>(loss_sum_ / loss_n_) : 0.0f;
  r.samples = samples_;
  r.mean_staleness = tau_n_ ? static_cast<float>(double(tau_sum_) / tau_n_) : 0.0f;
  r.max_staleness = static_cast<uint32_t>(std::min<uint64_t>(tau_max_, UINT32_MAX));
  r.rejected = static_cast<uint32_t>(rejected_);
  loss_sum_ = 0;
  loss_n_ = samples_ = tau_sum_ = tau_n_ = tau_max_ = rejected_ = 0;
  report_due_ = false;
  return r;
}

// --- shard ---

shard_core::shard_core(uint32_t id, std::vector<named_tensor> tensors, const model::update_config& rule,
                       std::string lr_schedule, int64_t total_updates, net::reader_limits limits,
                       const kernels::context& ctx)
    : id_(id), cfg_(rule), ctx_(kernels::context::with_threads(1)), schedule_(std::move(lr_schedule)),
      total_updates_(total_updates), limits_(limits), stats_(rule.workers) {
  if (tensors.empty()) throw error("shard " + std::to_string(id) + " holds no tensors");
  for (auto& t : tensors) {
    names_.push_back(t.name);
    shapes_.push_back(t.value.shape());
    flat_.insert(flat_.end(), t.value.data(), t.value.data() + t.value.numel());
  }
  n_ = static_cast<int64_t>(flat_.size());
  float* payload = nullptr;
  // On this thread alone: a kernel thread team started here (the run's main thread) would stay.
  current_ = build_params(flat_.data(), 0, false, false, &payload);
  ctx_ = ctx;
  in_message_ = payload != nullptr;
  if (in_message_) {
    w_ = payload;
    flat_ = std::vector<float>();
  } else {
    w_ = flat_.data();
  }
  rule_ = model::make_update_rule(cfg_, n_, ctx_);
}

std::vector<named_tensor> shard_core::snapshot() const {
  std::vector<named_tensor> out;
  const float* src = w_;
  for (std::size_t i = 0; i < names_.size(); ++i) {
    tensor t = tensor::empty(shapes_[i]);
    std::memcpy(t.data(), src, t.numel() * sizeof(float));
    src += t.numel();
    out.push_back({names_[i], std::move(t)});
  }
  return out;
}

void shard_core::restore(uint64_t version, const std::vector<named_tensor>& rule_state) {
  rule_->load_state(rule_state);
  version_ = version;
}

net::message shard_core::build_params(const float* w, uint64_t tau, bool rejected, bool with_state,
                                      float** payload) const {
  const std::vector<named_tensor> state = with_state ? rule_->state() : std::vector<named_tensor>{};
  std::size_t state_bytes = 0;
  for (const auto& t : state) state_bytes += t.value.numel() * sizeof(float) + 64 + t.name.size();
  auto b = builder(n_ * sizeof(float) + 64 * shapes_.size() + state_bytes);
  auto p = envelope(*b, id_).initParams();
  p.setShard(id_);
  p.setVersion(version_);
  p.setAppliedStaleness(tau);
  p.setRejected(rejected);
  const std::vector<float*> dst = net::init_tensors(p.initTensors(static_cast<unsigned>(shapes_.size())), shapes_);
  float* flat = net::flat_payload(dst, shapes_);
  if (flat) {
    kernels::copy(ctx_, n_, w, flat);
  } else {
    for (std::size_t i = 0; i < shapes_.size(); ++i) {
      std::memcpy(dst[i], w, shapes_[i].numel() * sizeof(float));
      w += shapes_[i].numel();
    }
  }
  if (with_state) net::encode(state, p.initRuleState(static_cast<unsigned>(state.size())));
  if (payload) *payload = flat;
  return net::message::from_builder(std::move(b));
}

void shard_core::own_parameters() {
  if (!in_message_) {
    current_ = net::message();  // it would hold the parameters before the update
    return;
  }
  if (current_.exclusive_builder()) return;
  float* payload = nullptr;
  current_ = build_params(w_, current_tau_, current_rejected_, false, &payload);
  current_version_ = version_;
  w_ = payload;  // the same layout as before: adjacent
}

net::message shard_core::reply(uint64_t tau, bool rejected) {
  if (auto* b = current_.exclusive_builder()) {
    auto p = b->getRoot<wire::Envelope>().getParams();
    p.setVersion(version_);
    p.setAppliedStaleness(tau);
    p.setRejected(rejected);
  } else if (current_.empty() || current_version_ != version_ || current_tau_ != tau ||
             current_rejected_ != rejected) {
    // current_ stays held until the copy is made: w_ may lie in its payload,
    // and the workers that hold it too may let it go at any moment.
    float* payload = nullptr;
    net::message next = build_params(w_, tau, rejected, false, &payload);
    if (in_message_) w_ = payload;
    current_ = std::move(next);
  }
  current_version_ = version_;
  current_tau_ = tau;
  current_rejected_ = rejected;
  return current_;
}

std::vector<std::pair<uint32_t, net::message>> shard_core::handle(const net::message& m, int64_t sender_hint) {
  std::vector<std::pair<uint32_t, net::message>> out;
  const int64_t n = n_;
  auto check_worker = [&](uint32_t w, const char* what) {
    if (w >= static_cast<uint32_t>(cfg_.workers))
      reject(net::reject_reason::malformed, std::string(what) + ": worker id " + std::to_string(w) + " outside [0, " +
                                                std::to_string(cfg_.workers) + ")");
  };
  try {
    net::envelope_reader r(m, limits_);
    switch (r.root().which()) {
      case wire::Envelope::PULL_PARAMS: {
        auto p = r.root().getPullParams();
        if (p.getShard() != id_) reject(net::reject_reason::wrong_shape, "pull for shard " + std::to_string(p.getShard()));
        const uint32_t w = p.getWorker();
        if (w != coordinator_id) {
          check_worker(w, "pull");
          rule_->on_send(w_, n, static_cast<int>(w));
        }
        out.emplace_back(w, p.getWithState() ? build_params(w_, 0, false, true) : reply(0, false));
        return out;
      }
      case wire::Envelope::PUSH_GRADIENT: {
        auto p = r.root().getPushGradient();
        const uint32_t w = p.getWorker();
        check_worker(w, "push");
        sender_hint = w;
        if (p.getShard() != id_) reject(net::reject_reason::wrong_shape, "push for shard " + std::to_string(p.getShard()));
        if (p.getBaseVersion() > version_)
          reject(net::reject_reason::malformed, "push: base version " + std::to_string(p.getBaseVersion()) +
                                                    " is ahead of the shard's " + std::to_string(version_));
        auto list = p.getTensors();
        net::require_shapes(list, shapes_, "push to shard " + std::to_string(id_));
        // The gradient is read in place when its payloads are adjacent (as
        // workers build them), else gathered into grad_.
        const float* g = net::flat_payload(list, "push");
        if (!g) {
          grad_.resize(static_cast<std::size_t>(n));
          float* dst = grad_.data();
          for (unsigned i = 0; i < list.size(); ++i) {
            net::tensor_view v = net::view(list[i], "push");
            std::memcpy(dst, v.data, v.numel() * sizeof(float));
            dst += v.numel();
          }
          g = grad_.data();
        }
        const uint64_t tau = version_ - p.getBaseVersion();
        rule_->set_lr(model::scheduled_lr(cfg_.lr, schedule_, static_cast<int64_t>(version_), total_updates_));
        own_parameters();
        const bool updated = rule_->apply(w_, g, n, static_cast<int>(w), static_cast<int64_t>(tau));
        stats_.record(static_cast<int>(w), static_cast<int64_t>(tau));
        if (updated) ++version_;
        if (cfg_.rule == "ssgd") {
          // Every worker of the round gets the same, once-built message.
          waiting_.emplace_back(w, tau);
          if (updated) {
            net::message params = reply(0, false);
            for (auto& [worker, t] : waiting_) out.emplace_back(worker, params);
            waiting_.clear();
          }
        } else {
          out.emplace_back(w, reply(tau, false));
        }
        return out;
      }
      default:
        reject(net::reject_reason::unknown_kind, "shard " + std::to_string(id_) + ": unexpected message kind " +
                                                     std::to_string(static_cast<int>(r.root().which())));
    }
  } catch (const net::message_error& e) {
    rejects_.count(e.reason());
    last_error_ = e.what();
  } catch (const error& e) {  // e.g. SSGD: two gradients of one worker in a round
    rejects_.count(net::reject_reason::malformed);
    last_error_ = e.what();
  }
  out.clear();
  // The sender still waits for an answer: the current parameters, flagged.
  if (sender_hint >= 0 && sender_hint < cfg_.workers)
    out.emplace_back(static_cast<uint32_t>(sender_hint), reply(0, true));
  return out;
}

void resume_shard(shard_core& shard, const net::checkpoint& c, const std::string& algorithm, int shards,
                  std::ostream& log) {
  const std::string fresh = "shard " + std::to_string(shard.id()) + ": the update rule's state starts fresh: ";
  if (c.optimizer_kind != algorithm) {
    log << fresh << "the checkpoint was written by '" << c.optimizer_kind << "', not " << algorithm << "\n";
    return;
  }
  if (c.shard_versions.size() != static_cast<std::size_t>(shards)) {
    log << fresh << "the checkpoint has " << c.shard_versions.size() << " shard(s), this run " << shards << "\n";
    return;
  }
  const std::string prefix = "shard" + std::to_string(shard.id()) + "/";
  std::vector<named_tensor> mine;
  for (const auto& t : c.optimizer)
    if (t.name.rfind(prefix, 0) == 0) mine.push_back({t.name.substr(prefix.size()), t.value});
  try {
    shard.restore(c.shard_versions[shard.id()], mine);
  } catch (const error& e) {
    log << fresh << e.what() << "\n";
  }
}

} // namespace troupe::actors
