#include "model/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "kernels/kernels.hpp"

namespace troupe::model {

namespace {

class sgd_optimizer final : public optimizer {
public:
  explicit sgd_optimizer(const optim::sgd& o) : optimizer(o.lr()), o_(o), velocity_("velocity") {}
  void step(const kernels::context& ctx, const std::vector<parameter*>& params) override {
    require_gradients(params);
    if (o_.momentum() == 0.0f) {
      for (parameter* p : params) kernels::sgd_step(ctx, p->value, p->grad, lr_, o_.weight_decay());
      return;
    }
    std::vector<kernels::update_slots> slots;
    for (parameter* p : params) slots.push_back({&p->value, &p->grad, &velocity_.get(*p)});
    kernels::momentum_steps(ctx, slots, lr_, o_.momentum(), o_.weight_decay(), o_.nesterov());
  }
  std::vector<named_tensor> state() const override {
    std::vector<named_tensor> out;
    velocity_.save(out);
    return out;
  }
  void load_state(const std::vector<parameter*>& params, const std::vector<named_tensor>& s) override {
    velocity_.load(params, s);
  }
  std::string describe() const override {
    return "sgd(lr " + std::to_string(lr_) + ", momentum " + std::to_string(o_.momentum()) + ")";
  }

private:
  optim::sgd o_;
  state_slots velocity_;
};

class adam_optimizer final : public optimizer {
public:
  explicit adam_optimizer(const optim::adam& o) : optimizer(o.lr()), o_(o), m_("adam.m"), v_("adam.v") {}
  void step(const kernels::context& ctx, const std::vector<parameter*>& params) override {
    require_gradients(params);
    ++step_;
    std::vector<kernels::update_slots> slots;
    for (parameter* p : params) slots.push_back({&p->value, &p->grad, &m_.get(*p), &v_.get(*p)});
    kernels::adam_steps(ctx, slots, lr_, o_.beta1(), o_.beta2(), o_.eps(), o_.weight_decay(), step_);
  }
  std::vector<named_tensor> state() const override {
    std::vector<named_tensor> out{{"adam.step", tensor::from({1}, {static_cast<float>(step_)})}};
    m_.save(out);
    v_.save(out);
    return out;
  }
  void load_state(const std::vector<parameter*>& params, const std::vector<named_tensor>& s) override {
    for (auto& e : s)
      if (e.name == "adam.step" && e.value.numel() == 1) step_ = static_cast<int64_t>(e.value.at(0));
    m_.load(params, s);
    v_.load(params, s);
  }
  std::string describe() const override { return "adam(lr " + std::to_string(lr_) + ")"; }

private:
  optim::adam o_;
  state_slots m_, v_;
  int64_t step_ = 0;
};

} // namespace

} // namespace troupe::model

namespace troupe::optim {

std::unique_ptr<model::optimizer> sgd::make() const {
  if (!(lr_ > 0.0f) || !std::isfinite(lr_)) throw error("sgd: learning rate must be positive, got " + std::to_string(lr_));
  if (!(momentum_ >= 0.0f && momentum_ < 1.0f))
    throw error("sgd: momentum must be in [0, 1), got " + std::to_string(momentum_));
  if (!(weight_decay_ >= 0.0f)) throw error("sgd: weight decay must be >= 0");
  return std::make_unique<model::sgd_optimizer>(*this);
}

std::unique_ptr<model::optimizer> adam::make() const {
  if (!(lr_ > 0.0f) || !std::isfinite(lr_)) throw error("adam: learning rate must be positive, got " + std::to_string(lr_));
  if (!(beta1_ >= 0.0f && beta1_ < 1.0f && beta2_ >= 0.0f && beta2_ < 1.0f))
    throw error("adam: betas must be in [0, 1)");
  if (!(eps_ > 0.0f)) throw error("adam: eps must be positive");
  return std::make_unique<model::adam_optimizer>(*this);
}

} // namespace troupe::optim

namespace troupe::model {

tensor& state_slots::get(const parameter& p) {
  tensor& t = slots_[p.name];
  if (!t.defined()) t = tensor::zeros(p.value.shape());
  return t;
}

void state_slots::save(std::vector<named_tensor>& out) const {
  for (const auto& [name, t] : slots_) out.push_back({prefix_ + "/" + name, t});
}

void state_slots::load(const std::vector<parameter*>& params, const std::vector<named_tensor>& in) {
  std::map<std::string, const parameter*> by_name;
  for (const parameter* p : params) by_name[p->name] = p;
  std::map<std::string, tensor> next;
  for (const named_tensor& e : in) {
    if (e.name.rfind(prefix_ + "/", 0) != 0) continue;
    const std::string name = e.name.substr(prefix_.size() + 1);
    const auto it = by_name.find(name);
    if (it == by_name.end()) throw error("optimizer state " + e.name + " names no parameter of this model");
    if (it->second->value.shape() != e.value.shape())
      throw error("optimizer state " + e.name + " has shape " + e.value.shape().to_string() +
                  ", the parameter has " + it->second->value.shape().to_string());
    next[name] = e.value.clone();
  }
  slots_ = std::move(next);
}

void optimizer::require_gradients(const std::vector<parameter*>& params) {
  for (const parameter* p : params)
    if (!p->grad.defined()) throw error("optimizer step: parameter " + p->name + " has no gradient (run backward first)");
}

const char* to_string(lr_schedule s) { return s == lr_schedule::cosine ? "cosine" : "constant"; }

float scheduled_lr(float base, lr_schedule schedule, int64_t step, int64_t total, int64_t warmup) {
  if (warmup > 0 && step < warmup) return static_cast<float>(base * double(step + 1) / double(warmup));
  if (warmup > 0) {
    step -= warmup;
    total -= warmup;
  }
  if (schedule != lr_schedule::cosine || total <= 0) return base;
  return static_cast<float>(0.5 * base * (1 + std::cos(M_PI * std::min<double>(1.0, step / double(total)))));
}

} // namespace troupe::model
