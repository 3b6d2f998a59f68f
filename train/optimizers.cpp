#include "train/optimizers.hpp"

#include <string>

#include "kernels/kernels.hpp"
#include "kernels/sequence.hpp"
#include "tensor/error.hpp"

namespace troupe::train {

namespace {

class adamw_optimizer final : public model::optimizer {
public:
  adamw_optimizer(float lr, float weight_decay) : optimizer(lr), weight_decay_(weight_decay), m_("adamw.m"), v_("adamw.v") {}
  void step(const kernels::context& ctx, const std::vector<model::parameter*>& params) override {
    require_gradients(params);
    ++step_;
    std::vector<kernels::update_slots> slots;
    for (model::parameter* p : params) slots.push_back({&p->value, &p->grad, &m_.get(*p), &v_.get(*p), decays(*p)});
    kernels::adamw_steps(ctx, slots, lr_, 0.9f, 0.999f, 1e-8f, weight_decay_, step_);
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
  model::state_slots m_, v_;
  int64_t step_ = 0;
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
