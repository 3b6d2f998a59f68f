#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/layer.hpp"

namespace troupe::model {

/// An optimizer's state of one kind, one tensor per parameter: saved as
/// "<prefix>/<parameter name>" ("velocity/0.dense.weight"), zeros at first use.
class state_slots {
public:
  explicit state_slots(std::string prefix) : prefix_(std::move(prefix)) {}
  /// `p`'s tensor, created as zeros of its shape the first time.
  tensor& get(const parameter& p);
  void save(std::vector<named_tensor>& out) const;
  /// Takes this kind's entries of `in` (the others are left alone); throws
  /// troupe::error for one that names no parameter of `params` or whose shape is not its parameter's.
  void load(const std::vector<parameter*>& params, const std::vector<named_tensor>& in);

private:
  std::string prefix_;
  std::map<std::string, tensor> slots_;
};

/// Updates parameters from their gradients; keeps per-parameter state
/// (velocity, Adam moments) that a checkpoint can save and restore.
class optimizer {
public:
  virtual ~optimizer() = default;
  /// Updates `params` from their gradients with kernels run in `ctx`.
  virtual void step(const kernels::context& ctx, const std::vector<parameter*>& params) = 0;
  /// Optimizer state by name ("velocity/0.dense.weight", "adam.step", ...).
  virtual std::vector<named_tensor> state() const = 0;
  /// Restores state saved by state(); throws when it does not fit `params`.
  virtual void load_state(const std::vector<parameter*>& params, const std::vector<named_tensor>& s) = 0;
  virtual std::string describe() const = 0;
  float learning_rate() const { return lr_; }
  void set_learning_rate(float lr) { lr_ = lr; }

protected:
  explicit optimizer(float lr) : lr_(lr) {}
  /// Throws troupe::error naming the first of `params` without a gradient: a
  /// step checks them all before it changes anything.
  static void require_gradients(const std::vector<parameter*>& params);
  float lr_;
};

/// How the learning rate changes over a run.
enum class lr_schedule {
  constant,  ///< the base rate throughout
  cosine,    ///< from the base rate down to 0 at the last step, along half a cosine
};
/// "constant", "cosine"
const char* to_string(lr_schedule s);

/// Learning rate after `step` of `total` steps under `schedule`.
/// With `warmup` > 0, the first `warmup` steps climb linearly to `base`
/// (step s: base * (s + 1) / warmup), and the schedule runs over the steps after them.
float scheduled_lr(float base, lr_schedule schedule, int64_t step, int64_t total, int64_t warmup = 0);

} // namespace troupe::model

namespace troupe::optim {

/// SGD, with optional momentum (heavy ball or Nesterov) and weight decay.
struct sgd {
  explicit sgd(float lr) : lr_(lr) {}
  sgd& momentum(float m) { momentum_ = m; return *this; }
  sgd& weight_decay(float wd) { weight_decay_ = wd; return *this; }
  sgd& nesterov(bool n) { nesterov_ = n; return *this; }
  float lr() const { return lr_; }
  float momentum() const { return momentum_; }
  float weight_decay() const { return weight_decay_; }
  bool nesterov() const { return nesterov_; }
  /// Throws troupe::error for a non-positive lr or momentum outside [0, 1).
  std::unique_ptr<model::optimizer> make() const;

private:
  float lr_, momentum_ = 0.0f, weight_decay_ = 0.0f;
  bool nesterov_ = false;
};

/// Adam (Kingma & Ba 2015).
struct adam {
  explicit adam(float lr = 1e-3f) : lr_(lr) {}
  adam& betas(float b1, float b2) { beta1_ = b1; beta2_ = b2; return *this; }
  adam& eps(float e) { eps_ = e; return *this; }
  adam& weight_decay(float wd) { weight_decay_ = wd; return *this; }
  float lr() const { return lr_; }
  float beta1() const { return beta1_; }
  float beta2() const { return beta2_; }
  float eps() const { return eps_; }
  float weight_decay() const { return weight_decay_; }
  std::unique_ptr<model::optimizer> make() const;

private:
  float lr_, beta1_ = 0.9f, beta2_ = 0.999f, eps_ = 1e-8f, weight_decay_ = 0.0f;
};

} // namespace troupe::optim
