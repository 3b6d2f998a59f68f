#pragma once

// Server-side update rules of the parameter server (docs/algorithms.md), as
// pure objects over one shard's flat parameter vector. The parameter-shard
// actor calls apply() once per PushGradient message; nothing here knows about
// actors or messages.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/context.hpp"
#include "tensor/tensor.hpp"

namespace troupe::model {

/// How a job trains: one plain loop, or data parallel on actors, most with a
/// parameter-server update rule (docs/algorithms.md). The one enum of the
/// algorithms: the table in model/update_rule.cpp gives each its name, its
/// traits and its rule, next to the rule's code.
enum class algorithm_kind { sequential, ssgd, asgd, sa_asgd, hogwild, dc_asgd_c, dc_asgd_a, ddc_asgd, allreduce };

struct update_config;
class update_rule;

/// What an algorithm is, declared once (model/update_rule.cpp's table): the
/// plan, the runtime, the coordinator and the shard read these instead of
/// naming algorithms.
struct algorithm_traits {
  algorithm_kind kind;
  const char* name;            ///< as on the command line and in job files: "ddc-asgd"
  bool on_actors;              ///< runs on actors (all but the sequential loop)
  bool synchronous;            ///< a round waits for every worker (SSGD): no lost worker, no pull retries
  bool shards;                 ///< parameter shards hold the parameters and apply the rule `make` makes
  bool shared_memory;          ///< one parameter buffer shared by the workers of one process (Hogwild!)
  bool collective;             ///< the workers allreduce their gradients and each steps its own replica
  /// The shards' update rule for `n` parameters (null without shards).
  std::unique_ptr<update_rule> (*make)(const update_config& c, int64_t n, const kernels::context& ctx);
  /// The run goes on when a worker's node is lost (an allreduce's group re-forms without it).
  bool survives_lost_workers() const { return on_actors && (!synchronous || collective); }
  /// A worker pulls again from shards that did not answer in time.
  bool retries_pulls() const { return on_actors && !synchronous; }
};
/// The traits of `k`.
const algorithm_traits& traits(algorithm_kind k);
/// "sequential", "ssgd", "asgd", "sa-asgd", "hogwild", "dc-asgd-c", "dc-asgd-a", "ddc-asgd", "allreduce".
const char* to_string(algorithm_kind k);
/// Every algorithm, in the table's order.
const std::vector<algorithm_kind>& all_algorithms();

/// Every constant of every rule; unused ones are ignored by the other rules.
struct update_config {
  algorithm_kind rule = algorithm_kind::asgd;  ///< an algorithm whose traits have shards
  float lr = 0.05f;           ///< eta
  int64_t warmup = 0;         ///< the shard's lr warms up over this many updates (model::scheduled_lr)
  int workers = 1;            ///< N: SSGD averages this many gradients per step
  float lambda = 0.04f;       ///< DC-ASGD-c: constant lambda
  float lambda0 = 2.0f;       ///< DC-ASGD-a / DDC-ASGD: lambda_t = lambda0 / sqrt(MS + eps)
  float rho_ms = 0.95f;       ///< DC-ASGD-a / DDC-ASGD: decay of the mean square MS
  float eps = 1e-7f;
  float alpha = 0.2f;         ///< DDC-ASGD: rho(tau) = 1 / (1 + alpha * tau); chosen in docs/algorithms.md
  float mu0 = 0.9f;           ///< DDC-ASGD: mu(tau) = max(0, 1 - (1 - mu0) * (1 + tau)); chosen in docs/algorithms.md
  /// DDC-ASGD's definition: 1 as above; 2 distrusts only excess staleness and
  /// tops up the momentum asynchrony implies (docs/algorithms.md, "DDC-ASGD v2"):
  ///   tau_bar <- running mean of staleness (decay tau_decay, the first message's tau to start)
  ///   rho = 1 / (1 + alpha * max(0, tau - tau_bar)),  mu = max(0, mu0 - tau_bar / (1 + tau_bar))
  int ddc_version = 1;
  float tau_decay = 0.99f;    ///< DDC-ASGD v2: decay of the running mean of staleness, per message
  /// ASGD and SA-ASGD: the shard steps by AdamW instead of SGD (betas 0.9 and
  /// 0.999, eps 1e-8, decoupled weight decay on the segments that decay), as
  /// the sequential loop's --optimizer adamw does; the other rules refuse it.
  bool adamw = false;
  float weight_decay = 0;
  /// The shard's tensors, in order: their sizes and whether weight decay
  /// applies to each (AdamW's groups). Empty: one segment without decay.
  std::vector<int64_t> segments;
  std::vector<bool> segment_decays;
};

/// Throws troupe::error naming the first invalid value.
void validate(const update_config& c);
/// True for the rules whose shards may step by AdamW (update_config::adamw): ASGD and SA-ASGD.
bool steps_by_adamw(algorithm_kind k);

/// One update rule with its per-worker state (w_bak, MS) and its own (v).
class update_rule {
public:
  virtual ~update_rule() = default;
  /// Applies worker `worker`'s gradient `g`, computed `staleness` versions ago,
  /// to `w` (n elements). Returns true when w changed (SSGD changes w only when
  /// the N-th gradient of a round arrives).
  virtual bool apply(float* w, const float* g, int64_t n, int worker, int64_t staleness) = 0;
  /// Records that `worker` now holds parameters `w` (DC rules: w_bak(m) <- w).
  virtual void on_send(const float* w, int64_t n, int worker) {}
  virtual std::string name() const = 0;
  /// Changes eta for the following updates (a learning-rate schedule).
  virtual void set_lr(float lr) = 0;
  /// The state a checkpoint keeps: "v" (DDC-ASGD's momentum), "ms/<worker>"
  /// (DC-ASGD-a and DDC-ASGD). w_bak is not kept: a worker's first pull after a
  /// resume sets it. SSGD's partly summed round is not kept either (its workers
  /// restart the round). ASGD, SA-ASGD and DC-ASGD-c keep none.
  virtual std::vector<named_tensor> state() const { return {}; }
  /// Restores state(); a name or size that does not fit is a troupe::error.
  virtual void load_state(const std::vector<named_tensor>& s);
};

/// The rule `c.rule` for a shard of `n` parameters; its kernels run in `ctx`.
/// Throws troupe::error for invalid constants and for an algorithm without
/// shards (sequential, Hogwild!), which has no rule.
std::unique_ptr<update_rule> make_update_rule(const update_config& c, int64_t n,
                                              const kernels::context& ctx = kernels::context{});

/// DDC-ASGD's trust in a gradient of staleness tau.
float ddc_rho(float alpha, int64_t tau);
/// DDC-ASGD's explicit momentum for staleness tau.
float ddc_mu(float mu0, int64_t tau);
/// DDC-ASGD v2's trust: only staleness above the running mean tau_bar is distrusted.
float ddc2_rho(float alpha, int64_t tau, float tau_bar);
/// DDC-ASGD v2's explicit momentum: the target mu0 less the momentum that
/// asynchrony with mean staleness tau_bar implies (1 - 1/(1 + tau_bar),
/// Mitliagkas et al. 2016: about 1 - 1/N for N equal workers).
float ddc2_mu(float mu0, float tau_bar);

/// Staleness of every applied message: mean, max, histogram, per worker.
class staleness_stats {
public:
  explicit staleness_stats(int workers = 0);
  void record(int worker, int64_t tau);
  int64_t count() const { return count_; }
  double mean() const { return count_ ? static_cast<double>(sum_) / count_ : 0.0; }
  int64_t max() const { return max_; }
  double worker_mean(int worker) const;
  /// histogram()[t] = messages with staleness t; the last bucket holds >= its index.
  const std::vector<int64_t>& histogram() const { return hist_; }
  void merge(const staleness_stats& o);

private:
  static constexpr int64_t buckets = 64;
  int64_t count_ = 0, sum_ = 0, max_ = 0;
  std::vector<int64_t> hist_;
  std::vector<int64_t> worker_sum_, worker_count_;
};

} // namespace troupe::model
