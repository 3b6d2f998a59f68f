#include "train/optimizers.hpp"

#include <map>
#include <string>

#include "kernels/kernels.hpp"
#include "kernels/sequence.hpp"
#include "tensor/error.hpp"

namespace troupe::train {

namespace {

/// One moment tensor per parameter, "<prefix>/<parameter name>", zeros at first use.
class moments {
public:
  explicit moments(std::string prefix) : prefix_(std::move(prefix)) {}
  tensor& get(const model::parameter& p) {
    tensor& t = slots_[p.name];
    if (!t.defined()) t = tensor::zeros(p.value.shape());
    return t;
  }
  void save(std::vector<named_tensor>& out) const {
    for (const auto& [name, t] : slots_) out.push_back({prefix_ + "/" + name, t});
  }
  void load(const std::vector<model::parameter*>& params, const std::vector<named_tensor>& in) {
    std::map<std::string, const model::parameter*> by_name;
    for (const model::parameter* p : params) by_name[p->name] = p;
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

private:
  std::string prefix_;
  std::map<std::string, tensor> slots_;
};

class adamw_optimizer final : public model::optimizer {
public:
  adamw_optimizer(float lr, float weight_decay) : optimizer(lr), weight_decay_(weight_decay), m_("adamw.m"), v_("adamw.v") {}
  void step(const kernels::context& ctx, const std::vector<model::parameter*>& params) override {
    for (model::parameter* p : params)
      if (!p->grad.defined()) throw error("optimizer step: parameter " + p->name + " has no gradient (run backward first)");
    ++step_;
    slots_.clear();
    for (model::parameter* p : params) slots_.push_back({&p->value, &p->grad, &m_.get(*p), &v_.get(*p), decays(*p)});
    kernels::adamw_steps(ctx, slots_, lr_, 0.9f, 0.999f, 1e-8f, weight_decay_, step_);
  }
  std::vector<named_tensor> state() const override {
    std::vector<named_tensor> out{{"adamw.step", tensor::from({1}, {static_cast<float>(step_)})}};
    m_.save(out);
    v_.save(out);
    return out;
  }
  void load_state(const std::vector<model::parameter*>& params, const std::vector<named_tensor>& s) override {
    for (const named_tensor& e : s)
      if (e.name == "adamw.step" && e.value.numel() == 1) step_ = static_cast<int64_t>(e.value.at(0));
    m_.load(params, s);
    v_.load(params, s);
  }
  std::string describe() const override {
    return "adamw(lr " + std::to_string(lr_) + ", weight decay " + std::to_string(weight_decay_) + ")";
  }

private:
  float weight_decay_;
  moments m_, v_;
  int64_t step_ = 0;
  std::vector<kernels::update_slots> slots_;  // the step's, kept to reuse its allocation
};

} // namespace

bool decays(const model::parameter& p) { return decays(p.name, p.value.shape()); }

bool decays(const std::string& name, const shape& s) {
  return s.rank() >= 2 && name.find("embedding.") == std::string::npos;
}

std::unique_ptr<model::optimizer> make_adamw(float lr, float weight_decay) {
  if (!(lr > 0.0f)) throw error("adamw: learning rate must be positive, got " + std::to_string(lr));
  if (!(weight_decay >= 0.0f)) throw error("adamw: weight decay must be >= 0, got " + std::to_string(weight_decay));
  return std::make_unique<adamw_optimizer>(lr, weight_decay);
}

std::unique_ptr<model::optimizer> make_optimizer(const settings& s) {
  if (s.optimizer == optimizer_kind::adamw) return make_adamw(s.lr, s.weight_decay);
  return optim::sgd(s.lr).momentum(s.momentum).weight_decay(s.weight_decay).make();
}

} // namespace troupe::train
