#pragma once

// The public training API: a job says what to train (a model factory and
// data), how (an algorithm, its distribution, a schedule) and what to report
// (callbacks, metrics, checkpoints). troupe::fit (actors/fit.hpp) runs it:
//
//   auto job = troupe::job()
//       .model([] { return nn::sequential(nn::flatten(), nn::dense(784, 10)); })
//       .data(troupe::data::fashion_mnist())
//       .algorithm(troupe::ddc_asgd().workers(4))
//       .epochs(5);
//   troupe::history h = troupe::fit(job);

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/context.hpp"
#include "model/model.hpp"
#include "model/optimizer.hpp"
#include "model/schedule.hpp"
#include "model/update_rule.hpp"
#include "train/cluster_spec.hpp"

namespace troupe::train {
class cost_cache;
}
#include "train/data_source.hpp"
#include "train/metrics.hpp"

namespace troupe {

using model::lr_schedule;
using model::pipeline_schedule;

/// troupe's version, "MAJOR.MINOR.PATCH": the project's version libtroupe was built from.
const char* version();

namespace detail {
template <class T>
inline constexpr bool always_false = false;
} // namespace detail

// The algorithms, their traits and their names are declared once, in
// model/update_rule.hpp beside the update rules.
using model::algorithm_kind;
using model::algorithm_traits;
using model::all_algorithms;
using model::to_string;
using model::traits;

/// What a long run prints while it trains.
enum class progress_mode {
  automatic,  ///< a bar on a terminal, else a line every 10 s
  bar,
  lines,
  none,
};
/// "auto", "bar", "lines", "none".
const char* to_string(progress_mode p);

/// How an allreduce sends its gradients: float32, or bfloat16 (half the
/// bytes, rounded to nearest even; the sums are taken in float32).
enum class reduce_dtype { f32, bf16 };
/// "f32", "bf16".
const char* to_string(reduce_dtype d);
/// Both, in the order above.
const std::vector<reduce_dtype>& all_reduce_dtypes();

/// How a pipeline's stages are cut and placed on devices: `even` cuts so that
/// the stages' multiply-adds are balanced and puts stage k on device k (the
/// default); the others run the placers of model/placement.hpp on each layer's
/// measured forward and backward time: random, greedy, optimal, or manual
/// (--pipeline-cuts and --stage-devices, checked against the memory limits).
enum class placement_kind { even, random, greedy, optimal, manual };
/// "even", "random", "greedy", "optimal", "manual".
const char* to_string(placement_kind k);
/// Every placement, in the order above; every pipeline schedule.
const std::vector<placement_kind>& all_placements();
const std::vector<pipeline_schedule>& all_pipeline_schedules();

/// Parse the names of to_string(); each throws troupe::error listing the choices.
algorithm_kind parse_algorithm(const std::string& name);
pipeline_schedule parse_pipeline_schedule(const std::string& name);
placement_kind parse_placement(const std::string& name);
lr_schedule parse_schedule(const std::string& name);
progress_mode parse_progress(const std::string& name);
reduce_dtype parse_reduce_dtype(const std::string& name);

/// An algorithm and how it is distributed: every plain value, as a job file holds it.
struct algorithm_settings {
  algorithm_kind kind = algorithm_kind::sequential;
  int workers = 1;              ///< data-parallel workers, each with its own part of the data
  int shards = 1;               ///< parameter shards: contiguous ranges of the parameter layout
  /// How the shards cut the layout: whole tensors, equal ranges of elements,
  /// or (the default) the one model::choose_shard_cut picks for the model.
  model::shard_cut shard_cut = model::shard_cut::automatic;
  int push_every = 1;           ///< k local steps per push (multi-granular updates)
  float worker_lr = 0;          ///< local optimizer's lr with push_every > 1 (0: the job's lr)
  float worker_momentum = 0;    ///< local optimizer's momentum with push_every > 1
  /// Relative speeds of the workers, as of devices (larger: faster; empty:
  /// all equal). Emulated: worker i is slowed by max(worker_speeds) /
  /// worker_speeds[i], so that 4,4,2,1 runs two workers at full speed, one
  /// at half and one at a quarter (worker_slowdowns()).
  std::vector<float> worker_speeds;
  int prefetch = 2;             ///< batches a loader keeps in flight per worker
  bool overlap = true;          ///< push each shard's gradients during backward (pipelined execution); false: linear
  bool overlap_receive = true;  ///< with overlap: run each shard's layers forward as soon as its weights arrive (P3)
  float lambda = 0.04f;         ///< DC-ASGD-c: constant lambda
  float lambda0 = 2.0f;         ///< DC-ASGD-a, DDC-ASGD: lambda_t = lambda0 / sqrt(MS + eps)
  float rho_ms = 0.95f;         ///< DC-ASGD-a, DDC-ASGD: decay of the mean square MS
  float alpha = 0.2f;           ///< DDC-ASGD: rho(tau) = 1 / (1 + alpha tau)
  float mu0 = 0.9f;             ///< DDC-ASGD: mu(tau) = max(0, 1 - (1 - mu0)(1 + tau)); v2: the momentum target
  int ddc_version = 1;          ///< DDC-ASGD's definition, 1 or 2 (model/update_rule.hpp)
  float tau_decay = 0.99f;      ///< DDC-ASGD v2: decay of the running mean of staleness
  /// Allreduce: gradients go out in buckets of about this many MB, each as
  /// soon as backward has filled it (0: one bucket, after backward).
  float bucket_mb = 1.0f;
  reduce_dtype allreduce_dtype = reduce_dtype::f32;  ///< allreduce: what the gradients travel as
};

/// Each worker's slowdown factor (>= 1) from a.worker_speeds: the fastest
/// worker's speed over its own (empty when worker_speeds is).
std::vector<float> worker_slowdowns(const algorithm_settings& a);

/// An algorithm with named setters: troupe::ddc_asgd().workers(8).shards(2).
class algorithm {
public:
  explicit algorithm(algorithm_kind k = algorithm_kind::sequential) { s_.kind = k; }
  explicit algorithm(const algorithm_settings& s) : s_(s) {}

  algorithm& workers(int n) { s_.workers = n; return *this; }
  algorithm& shards(int n) { s_.shards = n; return *this; }
  /// Equal ranges of elements (model::shard_cut::even: a large tensor is cut
  /// across shards, so that each shard's link carries its share), whole
  /// tensors (weights and gradients read where they arrive), or automatic
  /// (the default: even when whole tensors would leave one shard more than
  /// model::auto_cut_imbalance times an even share, see model::choose_shard_cut).
  algorithm& shard_cut(model::shard_cut c) { s_.shard_cut = c; return *this; }
  algorithm& push_every(int k) { s_.push_every = k; return *this; }
  algorithm& worker_lr(float lr) { s_.worker_lr = lr; return *this; }
  algorithm& worker_momentum(float m) { s_.worker_momentum = m; return *this; }
  /// Relative speeds of the workers, larger is faster (emulated; algorithm_settings::worker_speeds).
  algorithm& worker_speeds(std::vector<float> speeds) { s_.worker_speeds = std::move(speeds); return *this; }
  /// Replaced by worker_speeds(), where larger is faster as in device speeds.
  template <class T = void>
  algorithm& speeds(std::vector<float>) {
    static_assert(detail::always_false<T>,
                  "algorithm::speeds(slowdowns) was replaced by worker_speeds(speeds), where larger is faster as in "
                  "device speeds: speeds({1, 1, 2, 4}) is worker_speeds({4, 4, 2, 1})");
    return *this;
  }
  algorithm& prefetch(int n) { s_.prefetch = n; return *this; }
  /// Pipelined execution (default): each parameter shard's gradients go out as
  /// soon as backward has produced them, while it goes on; false: after the
  /// whole backward (linear execution).
  algorithm& overlap(bool on) { s_.overlap = on; return *this; }
  /// With overlap, the receiving side too (default): the next forward pass
  /// runs each shard's layers as soon as that shard's weights arrive, and the
  /// first layers' pushes and weights overtake the others on a link (P3's
  /// priority); false: the forward pass waits for every shard.
  algorithm& overlap_receive(bool on) { s_.overlap_receive = on; return *this; }
  algorithm& lambda(float v) { s_.lambda = v; return *this; }
  algorithm& lambda0(float v) { s_.lambda0 = v; return *this; }
  algorithm& rho_ms(float v) { s_.rho_ms = v; return *this; }
  algorithm& alpha(float v) { s_.alpha = v; return *this; }
  algorithm& mu0(float v) { s_.mu0 = v; return *this; }
  algorithm& ddc_version(int v) { s_.ddc_version = v; return *this; }
  /// Allreduce: the gradient bucket size in MB (0: one bucket after backward).
  algorithm& bucket_mb(float mb) { s_.bucket_mb = mb; return *this; }
  /// Allreduce: send the gradients as bfloat16 (half the bytes) or float32 (the default).
  algorithm& allreduce_dtype(reduce_dtype d) { s_.allreduce_dtype = d; return *this; }

  const algorithm_settings& settings() const { return s_; }

private:
  algorithm_settings s_;
};

/// One plain training loop in this process, no actors (the default).
inline algorithm sequential_sgd() { return algorithm(algorithm_kind::sequential); }
inline algorithm ssgd() { return algorithm(algorithm_kind::ssgd); }
inline algorithm asgd() { return algorithm(algorithm_kind::asgd); }
/// Staleness-aware ASGD: lr / max(1, tau).
inline algorithm sa_asgd() { return algorithm(algorithm_kind::sa_asgd); }
/// Workers of one process share one parameter buffer, updated without locks.
inline algorithm hogwild() { return algorithm(algorithm_kind::hogwild); }
inline algorithm dc_asgd_c() { return algorithm(algorithm_kind::dc_asgd_c); }
inline algorithm dc_asgd_a() { return algorithm(algorithm_kind::dc_asgd_a); }
inline algorithm ddc_asgd() { return algorithm(algorithm_kind::ddc_asgd); }
/// Synchronous data parallelism without shards: the workers allreduce their
/// gradients (a ring), and each applies the same optimizer step to its replica.
inline algorithm allreduce() { return algorithm(algorithm_kind::allreduce); }

/// Model parallelism: the model cut into stages that run as actors, micro-batches flowing through them.
struct pipeline_settings {
  int stages = 1;                 ///< pipeline stages; 1: no pipeline
  int micro_batches = 4;          ///< M: micro-batches per mini-batch (the batch size is divided among them)
  pipeline_schedule schedule = pipeline_schedule::gpipe;
  std::vector<int> cuts;          ///< the first layer of stages 1..K-1; empty: cut by the layers' costs
  int stash = 0;                  ///< 1F1B: weight versions a stage keeps (0: as many as it has in flight)
  placement_kind placement = placement_kind::even;
  /// Relative speeds of the devices stages run on (higher: faster; empty: K
  /// devices of speed 1). Emulated: a stage alone on this machine plays a
  /// device of speed h x fastest, h = the stages per thread of the node (at
  /// least 1: 4 stages on 2 cores, h = 2), and a stage on a device of speed v
  /// holds each action's output, busy meanwhile, until the action has lasted
  /// h x fastest / v x its layers' time measured alone here; without measured
  /// costs (a cluster's nodes), for (h x fastest / v - 1) x its compute time.
  std::vector<float> device_speeds;
  std::vector<float> device_memory_mb;  ///< per device, 0: no limit (empty: none)
  std::vector<int> stage_devices;       ///< manual placement: the device of each stage (empty: 0, 1, ...)
  /// The link between stages: {seconds per byte, seconds per message}, as
  /// bench/fit_link.sh fits them (empty: model::same_process_link()).
  std::vector<float> link_cost;
  /// A file keeping the layers' measured costs across processes (empty:
  /// measured again by each process): troupe_plan and the trainer given the
  /// same file place on the same costs (train/profile_cache.hpp).
  std::string profile_cache;
};

/// The sequential loop's optimizer (on actors the algorithm's update rule applies).
enum class optimizer_kind {
  sgd,    ///< SGD with momentum and L2 weight decay (--momentum, --weight-decay)
  adamw,  ///< AdamW: Adam (betas 0.9, 0.999, eps 1e-8) with decoupled weight decay (--weight-decay)
};
/// "sgd", "adamw".
const char* to_string(optimizer_kind k);
/// Both, in the order above.
const std::vector<optimizer_kind>& all_optimizers();
optimizer_kind parse_optimizer(const std::string& name);

/// Every plain value of a job: what a job file holds besides the model and the data.
struct settings {
  int epochs = 5;                 ///< passes over the training set
  int64_t batch_size = 64;        ///< samples per step
  float lr = 0.02f;               ///< learning rate (the server's on actors)
  float momentum = 0.9f;          ///< SGD momentum of the sequential loop
  float weight_decay = 0.0f;      ///< weight decay of the sequential loop (L2 for sgd, decoupled for adamw)
  optimizer_kind optimizer = optimizer_kind::sgd;  ///< the sequential loop's optimizer
  /// The sequential loop's matrix products: per product (the default, kernels/context.hpp), OpenBLAS,
  /// Eigen's, or troupe's own kernels.
  kernels::gemm_backend gemm = kernels::gemm_backend::automatic;
  /// Clips each step's gradient to this global L2 norm (the whole model's);
  /// 0: no clipping. The sequential loop and allreduce (after the mean).
  float clip_grad_norm = 0.0f;
  lr_schedule schedule = lr_schedule::cosine;
  /// The lr climbs linearly from lr/warmup_steps to lr over the first
  /// warmup_steps steps (updates, on actors), then follows `schedule` over the rest. 0: none.
  int64_t warmup_steps = 0;
  /// The sequential loop's batches per optimizer step: each step averages the
  /// gradients of `accumulate` batches of batch_size (weighted by their
  /// samples), as one batch of accumulate x batch_size would give them, with
  /// one batch's memory. Steps (the lr schedule, max_steps, checkpoints) count
  /// optimizer steps; an epoch's last step takes the batches left. 1: none.
  int64_t accumulate = 1;
  uint64_t seed = 1;              ///< initialisation, shuffling, dropout
  int threads = 0;                ///< CPU threads, 0: this process's share of the cores
  std::string checkpoint;         ///< resume from it when it exists; written after every epoch
  int64_t checkpoint_every_steps = 0;  ///< also write it every this many steps (0: per epoch only)
  double checkpoint_every_s = 0;       ///< also write it every this many seconds (0: per epoch only)
  std::string metrics_out;        ///< JSON Lines, one record per epoch
  int64_t max_steps = 0;          ///< stop after this many steps (updates on actors); 0: no limit
  bool evaluate = true;           ///< test accuracy after every epoch
  /// Hold out this fraction of the training set (its last samples, the same
  /// for every seed) as a validation set, scored after every epoch beside the
  /// test set, for choosing hyperparameters without looking at the test set. 0: none.
  double validation_fraction = 0;
  /// A language model: after every epoch's evaluation, sample this many
  /// tokens after a newline (generate()'s empty prompt) (temperature 0.8, top-k 20, seed 1: the same
  /// draws every epoch), the record's `sample` and the log's. 0: none.
  int64_t sample_tokens = 0;
  progress_mode progress = progress_mode::automatic;
  algorithm_settings algo;
  pipeline_settings pipeline;
  std::string trace;              ///< a Chrome trace (JSON) of the run's actors is written here; empty: none
};

/// Throws troupe::error naming the option and the first invalid value, e.g.
/// "--workers must be in [1, 1024], got 0".
void validate(const settings& s);

/// Whether a job of `s` runs on actors (data loaders, a coordinator, a timeline): its algorithm is
/// on actors, or it is a pipeline. Else it is the sequential loop.
bool runs_on_actors(const settings& s);

/// The server update rule's constants for `s`.
model::update_config rule_config(const settings& s);

/// What a step callback sees. stop() ends the run after this step: the epoch
/// in progress is evaluated, recorded and checkpointed as a partial epoch.
struct step_event {
  int64_t step = 0;       ///< optimizer steps (updates on actors) so far
  int epoch = 0;          ///< 1-based epoch in progress
  double loss = 0;        ///< this step's loss (on actors: a worker's report)
  uint32_t worker = 0;    ///< the reporting worker (0 in the sequential loop)
  void stop() const { if (stop_) *stop_ = true; }
  bool* stop_ = nullptr;  ///< set by the runtime
};

/// What an epoch callback sees: the epoch's record. stop() ends the run
/// after this epoch.
struct epoch_event : epoch_metrics {
  void stop() const { if (stop_) *stop_ = true; }
  bool* stop_ = nullptr;  ///< set by the runtime
};

/// Everything troupe::fit needs: a model factory, data, settings, callbacks.
class job {
public:
  /// Returns a model; fit builds it for the data's sample shape with the seed.
  using model_factory = std::function<troupe::model::model()>;
  /// Returns a language model for a vocabulary of `vocab_size` tokens (its
  /// output size): job.model([](int64_t v) { return zoo::gpt(v, 128); }, "gpt").
  /// The data must be text (data::text_file); fit builds it for [context] ids.
  using vocabulary_model_factory = std::function<troupe::model::model(int64_t vocab_size)>;

  /// The model to train, as a factory (the actors build one replica per
  /// concurrent step); `name` identifies it in logs and metrics.
  job& model(model_factory make, std::string name = "custom");
  /// A language model, made for the text data's vocabulary.
  job& model(vocabulary_model_factory make, std::string name = "custom");
  job& data(troupe::data::source d);
  job& algorithm(const troupe::algorithm& a) {
    s_.algo = a.settings();
    return *this;
  }
  job& epochs(int n) { s_.epochs = n; return *this; }
  job& batch_size(int64_t n) { s_.batch_size = n; return *this; }
  job& lr(float v) { s_.lr = v; return *this; }
  job& momentum(float v) { s_.momentum = v; return *this; }
  job& weight_decay(float v) { s_.weight_decay = v; return *this; }
  /// Clips each step's gradient to global L2 norm `v` (0: none).
  job& clip_grad_norm(float v) { s_.clip_grad_norm = v; return *this; }
  /// The sequential loop's optimizer: sgd (default) or adamw.
  job& optimizer(optimizer_kind k) { s_.optimizer = k; return *this; }
  job& schedule(lr_schedule v) { s_.schedule = v; return *this; }
  job& warmup_steps(int64_t v) { s_.warmup_steps = v; return *this; }
  /// Batches per optimizer step in the sequential loop (settings::accumulate).
  job& accumulate(int64_t batches) { s_.accumulate = batches; return *this; }
  job& gemm(kernels::gemm_backend v) { s_.gemm = v; return *this; }
  job& seed(uint64_t v) { s_.seed = v; return *this; }
  job& threads(int n) { s_.threads = n; return *this; }
  job& checkpoint(std::string path) { s_.checkpoint = std::move(path); return *this; }
  /// Also checkpoint every `steps` steps and/or every `seconds` seconds (0: not).
  job& checkpoint_every(int64_t steps, double seconds = 0) {
    s_.checkpoint_every_steps = steps;
    s_.checkpoint_every_s = seconds;
    return *this;
  }
  job& metrics_out(std::string path) { s_.metrics_out = std::move(path); return *this; }
  job& max_steps(int64_t n) { s_.max_steps = n; return *this; }
  job& validation_fraction(double f) { s_.validation_fraction = f; return *this; }
  /// A language model: n sampled tokens after every epoch, in its record (settings::sample_tokens).
  job& sample_tokens(int64_t n) { s_.sample_tokens = n; return *this; }
  job& evaluate(bool on) { s_.evaluate = on; return *this; }
  job& progress(progress_mode p) { s_.progress = p; return *this; }
  /// Cut the model into `stages` pipeline stages, each an actor; `micro_batches` per mini-batch.
  job& pipeline(int stages, int micro_batches = 4, pipeline_schedule schedule = pipeline_schedule::gpipe) {
    s_.pipeline.stages = stages;
    s_.pipeline.micro_batches = micro_batches;
    s_.pipeline.schedule = schedule;
    return *this;
  }
  /// Where the stages run: the placer and the devices' relative speeds (emulated).
  job& placement(placement_kind how, std::vector<float> device_speeds = {}) {
    s_.pipeline.placement = how;
    s_.pipeline.device_speeds = std::move(device_speeds);
    return *this;
  }
  /// Write the run's timeline (Chrome trace event format, for Perfetto) to `path`.
  job& trace(std::string path) { s_.trace = std::move(path); return *this; }
  /// All plain values at once (e.g. read from a job file).
  job& configure(const troupe::settings& s) {
    s_ = s;
    return *this;
  }
  /// The nodes of the run (a job file's [cluster] table); none: this process alone.
  job& cluster(train::cluster_spec c) { cluster_ = std::move(c); return *this; }
  /// Which node of the cluster this process is (--node); empty: from Slurm's
  /// environment, or the only node.
  job& node(std::string name) { node_ = std::move(name); return *this; }
  /// Called after every step (sequential) or every worker report (actors).
  job& on_step(std::function<void(const step_event&)> f) { on_step_ = std::move(f); return *this; }
  /// Called when an epoch's record is complete (after its evaluation).
  job& on_epoch(std::function<void(const epoch_event&)> f) { on_epoch_ = std::move(f); return *this; }

  const troupe::settings& config() const { return s_; }
  const train::cluster_spec& cluster_config() const { return cluster_; }
  const std::string& node_name() const { return node_; }
  /// Where a placer's measured layer costs are kept between runs of this
  /// program (train/profile_cache.hpp); none: each run measures (or reads
  /// --profile-cache).
  job& cost_cache(std::shared_ptr<train::cost_cache> c) { costs_ = std::move(c); return *this; }
  const std::shared_ptr<train::cost_cache>& costs() const { return costs_; }
  const std::string& model_name() const { return model_name_; }
  const troupe::data::source& data_source() const { return data_; }
  const std::function<void(const step_event&)>& step_callback() const { return on_step_; }
  const std::function<void(const epoch_event&)>& epoch_callback() const { return on_epoch_; }
  /// A fresh model built for samples of shape `sample` with the job's seed;
  /// a vocabulary_model_factory's for `vocab_size` tokens. Throws
  /// troupe::error when the job has no model or the model does not fit.
  troupe::model::model build_model(const shape& sample, int64_t vocab_size = 0) const;
  /// True when the job trains a language model: its data is text.
  bool language_model() const { return data_.is_text(); }
  /// Throws troupe::error naming what is missing or invalid; a language
  /// model on actors is one ("language models train in the sequential loop for now").
  void validate() const;

private:
  troupe::settings s_;
  train::cluster_spec cluster_;
  std::string node_;
  std::shared_ptr<train::cost_cache> costs_;
  model_factory make_;
  vocabulary_model_factory make_for_vocabulary_;
  std::string model_name_ = "custom";
  troupe::data::source data_;
  std::function<void(const step_event&)> on_step_;
  std::function<void(const epoch_event&)> on_epoch_;
};

} // namespace troupe
