#include "model/update_rule.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/kernels.hpp"
#include "kernels/sequence.hpp"
#include "model/flat_optimizer.hpp"
#include "tensor/error.hpp"

namespace troupe::model {

namespace {

/// Per-worker copies of the parameters each worker last received (w_bak) and,
/// for the adaptive rules, each worker's mean square of gradients (MS).
class worker_state {
public:
  worker_state(int workers, int64_t n, bool with_ms) : n_(n) {
    bak_.resize(workers);
    if (with_ms) ms_.assign(workers, std::vector<float>(n, 0.0f));
  }
  /// w_bak(m); before the worker's first pull it is the current w.
  const float* bak(int m, const float* w) {
    auto& b = bak_.at(m);
    if (b.empty()) b.assign(w, w + n_);
    return b.data();
  }
  void set_bak(int m, const float* w) { bak_.at(m).assign(w, w + n_); }
  std::vector<float>& ms(int m) { return ms_.at(m); }
  const std::vector<float>& ms(int m) const { return ms_.at(m); }

private:
  int64_t n_;
  std::vector<std::vector<float>> bak_, ms_;
};

void check_worker(int worker, int workers) {
  if (worker < 0 || worker >= workers)
    throw error("update rule: worker id " + std::to_string(worker) + " outside [0, " + std::to_string(workers) + ")");
}

class ssgd final : public update_rule {
public:
  ssgd(const update_config& c, int64_t n) : c_(c), sum_(n, 0.0f), seen_(c.workers, false) {}
  bool apply(float* w, const float* g, int64_t n, int worker, int64_t) override {
    check_worker(worker, c_.workers);
    if (seen_[worker])
      throw error("ssgd: worker " + std::to_string(worker) + " sent two gradients in one round");
    seen_[worker] = true;
    for (int64_t i = 0; i < n; ++i) sum_[i] += g[i];
    if (++arrived_ < c_.workers) return false;
    const float scale = c_.lr / static_cast<float>(c_.workers);
    for (int64_t i = 0; i < n; ++i) w[i] -= scale * sum_[i];
    std::fill(sum_.begin(), sum_.end(), 0.0f);
    std::fill(seen_.begin(), seen_.end(), false);
    arrived_ = 0;
    return true;
  }
  std::string name() const override { return "ssgd"; }
  void set_lr(float lr) override { c_.lr = lr; }

private:
  update_config c_;
  std::vector<float> sum_;
  std::vector<bool> seen_;
  int arrived_ = 0;
};

class asgd final : public update_rule {
public:
  asgd(const update_config& c, int64_t n, bool staleness_aware, const kernels::context& ctx)
      : c_(c), aware_(staleness_aware), ctx_(ctx) {
    if (!c.adamw) return;
    if (c_.segments.empty()) {
      c_.segments = {n};
      c_.segment_decays = {false};
    }
    check_segments(c_.segments, c_.segment_decays, n, name());
    m_ = tensor::zeros({n});
    v_ = tensor::zeros({n});
  }
  bool apply(float* w, const float* g, int64_t n, int worker, int64_t tau) override {
    check_worker(worker, c_.workers);
    // Zhang et al. 2016: eta / max(1, tau).
    const float lr = aware_ ? c_.lr / static_cast<float>(std::max<int64_t>(1, tau)) : c_.lr;
    if (!c_.adamw) {
      kernels::axpy(ctx_, n, -lr, g, w);
      return true;
    }
    if (n != m_.numel()) throw error(name() + ": a gradient of " + std::to_string(n) + " values for a shard of " + std::to_string(m_.numel()));
    ++step_;
    adamw_segments(ctx_, w, g, m_.data(), v_.data(), c_.segments, c_.segment_decays, lr, c_.weight_decay, step_);
    return true;
  }
  std::string name() const override { return std::string(aware_ ? "sa-asgd" : "asgd") + (c_.adamw ? "+adamw" : ""); }
  void set_lr(float lr) override { c_.lr = lr; }
  /// With AdamW: its moments and step count.
  std::vector<named_tensor> state() const override {
    if (!c_.adamw) return {};
    return {{"adamw.m", m_.clone()}, {"adamw.v", v_.clone()},
            {"adamw.step", tensor::from({1}, {static_cast<float>(step_)})}};
  }
  void load_state(const std::vector<named_tensor>& s) override {
    if (!c_.adamw) return update_rule::load_state(s);
    // Every entry is checked before any is taken.
    for (const auto& [key, t] : s) {
      const int64_t want = key == "adamw.step" ? 1 : m_.numel();
      if (key != "adamw.m" && key != "adamw.v" && key != "adamw.step")
        throw error(name() + " state: unexpected entry '" + key + "'");
      if (t.numel() != want)
        throw error(name() + " state: '" + key + "' holds " + std::to_string(t.numel()) + " values, not " + std::to_string(want));
    }
    for (const auto& [key, t] : s) {
      if (key == "adamw.step") step_ = static_cast<int64_t>(t.at(0));
      else kernels::copy(ctx_, t.numel(), t.data(), (key == "adamw.m" ? m_ : v_).data());
    }
  }

private:
  update_config c_;
  bool aware_;
  kernels::context ctx_;
  tensor m_, v_;  // AdamW's moments
  int64_t step_ = 0;
};

/// DC-ASGD-c, DC-ASGD-a and DDC-ASGD: one loop, three settings.
class delay_compensated final : public update_rule {
public:
  enum class kind { constant, adaptive, dynamic };
  delay_compensated(const update_config& c, int64_t n, kind k)
      : c_(c), k_(k), state_(c.workers, n, k != kind::constant) {
    if (k == kind::dynamic) v_.assign(n, 0.0f);
  }
  bool apply(float* w, const float* g, int64_t n, int worker, int64_t tau) override {
    check_worker(worker, c_.workers);
    const float* bak = state_.bak(worker, w);
    float rho = 1.0f, mu = 0.0f;
    if (k_ == kind::dynamic && c_.ddc_version == 2) {
      if (!tau_started_) tau_bar_ = static_cast<float>(tau);
      tau_started_ = true;
      rho = ddc2_rho(c_.alpha, tau, tau_bar_);
      mu = ddc2_mu(c_.mu0, tau_bar_);
      tau_bar_ = c_.tau_decay * tau_bar_ + (1.0f - c_.tau_decay) * static_cast<float>(tau);
    } else if (k_ == kind::dynamic) {
      rho = ddc_rho(c_.alpha, tau);
      mu = ddc_mu(c_.mu0, tau);
    }
    float* ms = k_ == kind::constant ? nullptr : state_.ms(worker).data();
    for (int64_t i = 0; i < n; ++i) {
      const float gg = g[i] * g[i];
      float lambda = c_.lambda;
      if (ms) {
        ms[i] = c_.rho_ms * ms[i] + (1.0f - c_.rho_ms) * gg;
        lambda = c_.lambda0 / std::sqrt(ms[i] + c_.eps);
      }
      const float g_hat = g[i] + lambda * gg * (w[i] - bak[i]);
      if (k_ == kind::dynamic) {
        v_[i] = mu * v_[i] + rho * g_hat;
        w[i] -= c_.lr * v_[i];
      } else {
        w[i] -= c_.lr * g_hat;
      }
    }
    state_.set_bak(worker, w);
    return true;
  }
  void on_send(const float* w, int64_t, int worker) override {
    check_worker(worker, c_.workers);
    state_.set_bak(worker, w);
  }
  std::vector<named_tensor> state() const override {
    std::vector<named_tensor> out;
    auto add = [&](const std::string& name, const std::vector<float>& v) {
      tensor t = tensor::empty(shape{static_cast<int64_t>(v.size())});
      std::copy(v.begin(), v.end(), t.data());
      out.push_back({name, std::move(t)});
    };
    if (k_ == kind::dynamic) add("v", v_);
    if (k_ == kind::dynamic && c_.ddc_version == 2 && tau_started_) add("tau_bar", {tau_bar_});
    if (k_ != kind::constant)
      for (int m = 0; m < c_.workers; ++m) add("ms/" + std::to_string(m), state_.ms(m));
    return out;
  }
  void load_state(const std::vector<named_tensor>& s) override {
    // Every entry is checked before any is taken: a state that does not fit changes nothing.
    std::vector<std::pair<std::vector<float>*, const tensor*>> take;
    for (const auto& [key, t] : s) {
      std::vector<float>* into = nullptr;
      if (key == "v" && k_ == kind::dynamic) into = &v_;
      if (key == "tau_bar" && k_ == kind::dynamic && c_.ddc_version == 2) {
        tau_load_.assign(1, 0.0f);
        into = &tau_load_;
      }
      if (key.rfind("ms/", 0) == 0 && k_ != kind::constant) {
        const std::string id = key.substr(3);
        const bool digits = !id.empty() && id.size() < 10 && id.find_first_not_of("0123456789") == std::string::npos;
        if (digits && std::stoi(id) < c_.workers) into = &state_.ms(std::stoi(id));
      }
      if (!into) throw error(name() + " state: unexpected entry '" + key + "' (with " + std::to_string(c_.workers) + " workers)");
      if (t.numel() != static_cast<int64_t>(into->size()))
        throw error(name() + " state: '" + key + "' holds " + std::to_string(t.numel()) + " values, the shard has " +
                    std::to_string(into->size()));
      take.emplace_back(into, &t);
    }
    for (auto& [into, t] : take) into->assign(t->data(), t->data() + t->numel());
    if (!tau_load_.empty()) {
      tau_bar_ = tau_load_[0];
      tau_started_ = true;
      tau_load_.clear();
    }
  }
  std::string name() const override {
    return k_ == kind::constant ? "dc-asgd-c" : k_ == kind::adaptive ? "dc-asgd-a" : c_.ddc_version == 2 ? "ddc-asgd-v2" : "ddc-asgd";
  }
  void set_lr(float lr) override { c_.lr = lr; }

private:
  update_config c_;
  kind k_;
  worker_state state_;
  std::vector<float> v_;
  float tau_bar_ = 0;             // v2: running mean of staleness
  bool tau_started_ = false;      // v2: a message has set tau_bar_
  std::vector<float> tau_load_;   // v2: load_state's entry, checked before it is taken
};

} // namespace

void update_rule::load_state(const std::vector<named_tensor>& s) {
  if (!s.empty()) throw error(name() + " keeps no state, the checkpoint holds '" + s.front().name + "'");
}

float ddc_rho(float alpha, int64_t tau) { return 1.0f / (1.0f + alpha * static_cast<float>(tau)); }

float ddc_mu(float mu0, int64_t tau) {
  return std::max(0.0f, 1.0f - (1.0f - mu0) * (1.0f + static_cast<float>(tau)));
}

float ddc2_rho(float alpha, int64_t tau, float tau_bar) {
  return 1.0f / (1.0f + alpha * std::max(0.0f, static_cast<float>(tau) - tau_bar));
}

float ddc2_mu(float mu0, float tau_bar) { return std::max(0.0f, mu0 - tau_bar / (1.0f + tau_bar)); }

void validate(const update_config& c) {
  auto bad = [](const std::string& m) { throw error("update rule: " + m); };
  if (!(c.lr > 0.0f) || !std::isfinite(c.lr)) bad("learning rate must be positive");
  if (c.workers < 1) bad("workers must be at least 1, got " + std::to_string(c.workers));
  if (!(c.lambda >= 0.0f)) bad("lambda must be >= 0");
  if (!(c.lambda0 >= 0.0f)) bad("lambda0 must be >= 0");
  if (!(c.rho_ms >= 0.0f && c.rho_ms < 1.0f)) bad("rho_ms must be in [0, 1)");
  if (!(c.eps > 0.0f)) bad("eps must be positive");
  if (!(c.alpha >= 0.0f)) bad("alpha must be >= 0");
  if (!(c.mu0 >= 0.0f && c.mu0 < 1.0f)) bad("mu0 must be in [0, 1)");
  if (c.ddc_version != 1 && c.ddc_version != 2) bad("ddc version must be 1 or 2, got " + std::to_string(c.ddc_version));
  if (!(c.tau_decay >= 0.0f && c.tau_decay < 1.0f)) bad("tau_decay must be in [0, 1)");
  if (!(c.weight_decay >= 0.0f)) bad("weight decay must be >= 0");
}

bool steps_by_adamw(algorithm_kind k) { return k == algorithm_kind::asgd || k == algorithm_kind::sa_asgd; }

namespace {

using dc = delay_compensated;
using rule_ptr = std::unique_ptr<update_rule>;

// Every algorithm, once: its name, its traits and its rule. The order is all_algorithms()'s.
const std::vector<algorithm_traits>& algorithm_table() {
  using k = algorithm_kind;
  using ctx = const kernels::context&;
  //  kind           name         actors synchronous shards shared collective rule
  static const std::vector<algorithm_traits> table{
      {k::sequential, "sequential", false, false, false, false, false, nullptr},
      {k::ssgd, "ssgd", true, true, true, false, false,
       [](const update_config& c, int64_t n, ctx) { return rule_ptr(new ssgd(c, n)); }},
      {k::asgd, "asgd", true, false, true, false, false,
       [](const update_config& c, int64_t n, ctx x) { return rule_ptr(new asgd(c, n, false, x)); }},
      {k::sa_asgd, "sa-asgd", true, false, true, false, false,
       [](const update_config& c, int64_t n, ctx x) { return rule_ptr(new asgd(c, n, true, x)); }},
      {k::hogwild, "hogwild", true, false, false, true, false, nullptr},
      {k::dc_asgd_c, "dc-asgd-c", true, false, true, false, false,
       [](const update_config& c, int64_t n, ctx) { return rule_ptr(new dc(c, n, dc::kind::constant)); }},
      {k::dc_asgd_a, "dc-asgd-a", true, false, true, false, false,
       [](const update_config& c, int64_t n, ctx) { return rule_ptr(new dc(c, n, dc::kind::adaptive)); }},
      {k::ddc_asgd, "ddc-asgd", true, false, true, false, false,
       [](const update_config& c, int64_t n, ctx) { return rule_ptr(new dc(c, n, dc::kind::dynamic)); }},
      {k::allreduce, "allreduce", true, true, false, false, true, nullptr},
  };
  return table;
}

} // namespace

const algorithm_traits& traits(algorithm_kind k) {
  for (const algorithm_traits& t : algorithm_table())
    if (t.kind == k) return t;
  throw error("unknown algorithm kind " + std::to_string(static_cast<int>(k)));
}

const char* to_string(algorithm_kind k) { return traits(k).name; }

const std::vector<algorithm_kind>& all_algorithms() {
  static const std::vector<algorithm_kind> all = [] {
    std::vector<algorithm_kind> v;
    for (const algorithm_traits& t : algorithm_table()) v.push_back(t.kind);
    return v;
  }();
  return all;
}

std::unique_ptr<update_rule> make_update_rule(const update_config& c, int64_t n, const kernels::context& ctx) {
  validate(c);
  const algorithm_traits& t = traits(c.rule);
  if (!t.make) throw error(std::string("algorithm ") + t.name + " has no parameter-server update rule");
  if (c.adamw && !steps_by_adamw(c.rule))
    throw error(std::string("update rule ") + t.name + ": its compensation or averaging is defined on SGD steps, not AdamW");
  return t.make(c, n, ctx);
}

staleness_stats::staleness_stats(int workers)
    : hist_(buckets, 0), worker_sum_(std::max(0, workers), 0), worker_count_(std::max(0, workers), 0) {}

void staleness_stats::record(int worker, int64_t tau) {
  if (tau < 0) throw error("staleness " + std::to_string(tau) + " is negative: base version ahead of the shard");
  ++count_;
  sum_ += tau;
  max_ = std::max(max_, tau);
  ++hist_[std::min<int64_t>(tau, buckets - 1)];
  if (worker >= static_cast<int>(worker_sum_.size())) {
    worker_sum_.resize(worker + 1, 0);
    worker_count_.resize(worker + 1, 0);
  }
  worker_sum_[worker] += tau;
  ++worker_count_[worker];
}

double staleness_stats::worker_mean(int worker) const {
  if (worker < 0 || worker >= static_cast<int>(worker_count_.size()) || worker_count_[worker] == 0) return 0.0;
  return static_cast<double>(worker_sum_[worker]) / worker_count_[worker];
}

void staleness_stats::merge(const staleness_stats& o) {
  count_ += o.count_;
  sum_ += o.sum_;
  max_ = std::max(max_, o.max_);
  for (int64_t i = 0; i < buckets; ++i) hist_[i] += o.hist_[i];
  if (o.worker_sum_.size() > worker_sum_.size()) {
    worker_sum_.resize(o.worker_sum_.size(), 0);
    worker_count_.resize(o.worker_count_.size(), 0);
  }
  for (std::size_t i = 0; i < o.worker_sum_.size(); ++i) {
    worker_sum_[i] += o.worker_sum_[i];
    worker_count_[i] += o.worker_count_[i];
  }
}

} // namespace troupe::model
