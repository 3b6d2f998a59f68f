#include "train/job.hpp"

#include <algorithm>
#include <cmath>

#include "tensor/error.hpp"
#include "train/job_file.hpp"

namespace troupe {

#ifndef TROUPE_VERSION
#error "TROUPE_VERSION is the project's version, set by CMakeLists.txt"
#endif
#define TROUPE_STRING_OF(x) #x
#define TROUPE_STRING(x) TROUPE_STRING_OF(x)
const char* version() { return TROUPE_STRING(TROUPE_VERSION); }
#undef TROUPE_STRING
#undef TROUPE_STRING_OF

std::vector<float> worker_slowdowns(const algorithm_settings& a) {
  std::vector<float> out;
  if (a.worker_speeds.empty()) return out;
  float fastest = 0;
  for (float v : a.worker_speeds) fastest = std::max(fastest, v);
  for (float v : a.worker_speeds) out.push_back(v > 0 ? fastest / v : 1.0f);
  return out;
}

namespace {

template <class E>
std::string choices(const std::vector<E>& all) {
  std::string out;
  for (std::size_t i = 0; i < all.size(); ++i)
    out += std::string(i == 0 ? "" : i + 1 == all.size() ? " or " : ", ") + to_string(all[i]);
  return out;
}

template <class E>
E parse_choice(const std::string& name, const std::vector<E>& all, const char* what) {
  for (E e : all)
    if (name == to_string(e)) return e;
  throw error(std::string("unknown ") + what + " '" + name + "' (choose " + choices(all) + ")");
}

const std::vector<lr_schedule> schedules{lr_schedule::constant, lr_schedule::cosine};
const std::vector<progress_mode> progress_modes{progress_mode::automatic, progress_mode::bar, progress_mode::lines,
                                                progress_mode::none};

} // namespace

const char* to_string(progress_mode p) {
  switch (p) {
    case progress_mode::automatic: return "auto";
    case progress_mode::bar: return "bar";
    case progress_mode::lines: return "lines";
    case progress_mode::none: return "none";
  }
  return "unknown";
}

const char* to_string(placement_kind k) {
  switch (k) {
    case placement_kind::even: return "even";
    case placement_kind::random: return "random";
    case placement_kind::greedy: return "greedy";
    case placement_kind::optimal: return "optimal";
    case placement_kind::manual: return "manual";
  }
  return "unknown";
}

const std::vector<placement_kind>& all_placements() {
  static const std::vector<placement_kind> all{placement_kind::even, placement_kind::random, placement_kind::greedy,
                                               placement_kind::optimal, placement_kind::manual};
  return all;
}

const std::vector<pipeline_schedule>& all_pipeline_schedules() {
  static const std::vector<pipeline_schedule> all{pipeline_schedule::gpipe, pipeline_schedule::one_f_one_b};
  return all;
}

placement_kind parse_placement(const std::string& name) { return parse_choice(name, all_placements(), "placement"); }

algorithm_kind parse_algorithm(const std::string& name) { return parse_choice(name, all_algorithms(), "algorithm"); }
lr_schedule parse_schedule(const std::string& name) { return parse_choice(name, schedules, "schedule"); }
pipeline_schedule parse_pipeline_schedule(const std::string& name) {
  return parse_choice(name, all_pipeline_schedules(), "pipeline schedule");
}
progress_mode parse_progress(const std::string& name) { return parse_choice(name, progress_modes, "progress mode"); }

const char* to_string(optimizer_kind k) { return k == optimizer_kind::adamw ? "adamw" : "sgd"; }
const std::vector<optimizer_kind>& all_optimizers() {
  static const std::vector<optimizer_kind> all{optimizer_kind::sgd, optimizer_kind::adamw};
  return all;
}
optimizer_kind parse_optimizer(const std::string& name) { return parse_choice(name, all_optimizers(), "optimizer"); }

const char* to_string(reduce_dtype d) { return d == reduce_dtype::bf16 ? "bf16" : "f32"; }
const std::vector<reduce_dtype>& all_reduce_dtypes() {
  static const std::vector<reduce_dtype> all{reduce_dtype::f32, reduce_dtype::bf16};
  return all;
}
reduce_dtype parse_reduce_dtype(const std::string& name) {
  return parse_choice(name, all_reduce_dtypes(), "allreduce dtype");
}

model::update_config rule_config(const settings& s) {
  model::update_config c;
  c.rule = s.algo.kind;
  c.lr = s.lr;
  c.warmup = s.warmup_steps;
  c.workers = s.algo.workers;
  c.lambda = s.algo.lambda;
  c.lambda0 = s.algo.lambda0;
  c.rho_ms = s.algo.rho_ms;
  c.alpha = s.algo.alpha;
  c.mu0 = s.algo.mu0;
  c.ddc_version = s.algo.ddc_version;
  c.tau_decay = s.algo.tau_decay;
  c.adamw = s.optimizer == optimizer_kind::adamw;
  c.weight_decay = s.weight_decay;
  return c;
}

namespace {

[[noreturn]] void bad(const std::string& m) { throw error(m); }
template <class T>
std::string n2s(T v) { return std::to_string(v); }

/// The pipeline and placement options of validate(), beyond each value's range.
void validate_pipeline(const settings& s) {
  const pipeline_settings& p = s.pipeline;
  if (!p.link_cost.empty() && p.link_cost.size() != 2)
    bad("--link-cost: give seconds per byte and seconds per message, e.g. 6e-10,2e-5 (got " +
        n2s(p.link_cost.size()) + " values)");
  if (p.stages > 1) {
    if (p.micro_batches > s.batch_size)
      bad("--micro-batches " + n2s(p.micro_batches) + " exceeds --batch-size " + n2s(s.batch_size));
    if (!p.cuts.empty() && static_cast<int>(p.cuts.size()) != p.stages - 1)
      bad("--pipeline-cuts: " + n2s(p.cuts.size()) + " cuts for " + n2s(p.stages) + " stages (give stages - 1)");
    for (std::size_t i = 0; i < p.cuts.size(); ++i)
      if (p.cuts[i] < 1 || (i > 0 && p.cuts[i] <= p.cuts[i - 1]))
        bad("--pipeline-cuts must be increasing layer indices >= 1");
    const int devices = p.device_speeds.empty() ? p.stages : static_cast<int>(p.device_speeds.size());
    if (devices < p.stages)
      bad("--device-speeds: " + n2s(devices) + " devices for " + n2s(p.stages) + " stages (give at least one per stage)");
    if (!p.device_memory_mb.empty() && static_cast<int>(p.device_memory_mb.size()) != devices)
      bad("--device-memory: " + n2s(p.device_memory_mb.size()) + " limits for " + n2s(devices) + " devices");
    if (p.placement == placement_kind::manual && p.cuts.empty())
      bad("--placement manual needs --pipeline-cuts (and --stage-devices, or stages go on devices 0, 1, ...)");
    if (!p.stage_devices.empty() && p.placement != placement_kind::manual && p.placement != placement_kind::even)
      bad("--stage-devices goes with --placement manual or even, not " + std::string(to_string(p.placement)));
    if (!p.stage_devices.empty()) {
      if (static_cast<int>(p.stage_devices.size()) != p.stages)
        bad("--stage-devices: " + n2s(p.stage_devices.size()) + " devices for " + n2s(p.stages) + " stages");
      for (std::size_t i = 0; i < p.stage_devices.size(); ++i) {
        if (p.stage_devices[i] < 0 || p.stage_devices[i] >= devices)
          bad("--stage-devices: device " + n2s(p.stage_devices[i]) + " of " + n2s(devices) + " devices");
        for (std::size_t j = 0; j < i; ++j)
          if (p.stage_devices[j] == p.stage_devices[i])
            bad("--stage-devices: device " + n2s(p.stage_devices[i]) + " given to two stages");
      }
    }
  } else if (p.placement != placement_kind::even || !p.device_speeds.empty() || !p.stage_devices.empty() ||
             (!p.link_cost.empty() && s.algo.workers < 2)) {
    bad("--placement, --device-speeds, --stage-devices and --link-cost place pipeline stages: give --pipeline-stages K > 1 "
        "(--link-cost also prices a data-parallel job's links in troupe_plan, with --workers N > 1)");
  }
}

} // namespace

bool runs_on_actors(const settings& s) { return traits(s.algo.kind).on_actors || s.pipeline.stages > 1; }

void validate(const settings& s) {
  train::check_ranges(s);  // every value's range, from the key table
  if ((s.checkpoint_every_steps > 0 || s.checkpoint_every_s > 0) && s.checkpoint.empty())
    bad("--checkpoint-every-steps and --checkpoint-every-seconds need --checkpoint FILE");
  const algorithm_settings& a = s.algo;
  if (!a.worker_speeds.empty() && static_cast<int>(a.worker_speeds.size()) != a.workers)
    bad("--worker-speeds: " + n2s(a.worker_speeds.size()) + " speeds for " + n2s(a.workers) +
        " workers (give one per worker, larger is faster, e.g. 4,4,2,1)");
  validate_pipeline(s);
  const algorithm_traits& t = traits(a.kind);
  if (!t.on_actors && (a.workers != 1 || a.shards != 1 || a.push_every != 1 || !a.worker_speeds.empty()))
    bad("--workers, --shards, --push-every and --worker-speeds need an asynchronous --algorithm (e.g. --algorithm "
        "asgd)");
  if (t.shared_memory && (a.shards != 1 || a.push_every != 1))
    bad(std::string("--algorithm ") + t.name +
        " shares one buffer in this process: --shards and --push-every do not apply");
  if (t.synchronous && a.push_every != 1) bad(std::string("--algorithm ") + t.name + " takes --push-every 1");
  if (t.collective && a.shards != 1) bad(std::string("--algorithm ") + t.name + " has no parameter shards: leave --shards out");
  if (a.shard_cut != model::shard_cut::automatic && !t.shards)
    bad(std::string("--algorithm ") + t.name + " has no parameter shards: leave --shard-cut out");
  if (t.shards) model::validate(rule_config(s));
}

job& job::model(model_factory make, std::string name) {
  make_ = std::move(make);
  make_for_vocabulary_ = nullptr;
  model_name_ = std::move(name);
  return *this;
}

job& job::model(vocabulary_model_factory make, std::string name) {
  make_for_vocabulary_ = std::move(make);
  make_ = nullptr;
  model_name_ = std::move(name);
  return *this;
}

job& job::data(troupe::data::source d) {
  data_ = std::move(d);
  return *this;
}

troupe::model::model job::build_model(const shape& sample, int64_t vocab_size) const {
  if (!make_ && !make_for_vocabulary_)
    throw error("the job has no model: give it one with job.model([] { return nn::sequential(...); })");
  if (make_for_vocabulary_ && vocab_size < 1)
    throw error("model " + model_name_ + " is made for a vocabulary: it needs text data (data::text_file)");
  troupe::model::model m = make_ ? make_() : make_for_vocabulary_(vocab_size);
  m.build(sample, s_.seed);
  return m;
}

void job::validate() const {
  troupe::validate(s_);
  if (!make_ && !make_for_vocabulary_)
    throw error("the job has no model: give it one with job.model([] { return nn::sequential(...); })");
  if (data_.empty()) throw error("the job has no data: give it one with job.data(...), e.g. troupe::data::fashion_mnist()");
  if (make_for_vocabulary_ && !data_.is_text())
    throw error("model " + model_name_ + " is made for a vocabulary (job.model([](int64_t vocab) {...})): its data "
                "must be text, e.g. troupe::data::text_file(path), not " + data_.description());
  if (s_.gemm != kernels::gemm_backend::automatic && runs_on_actors(s_))
    throw error("--gemm " + std::string(kernels::to_string(s_.gemm)) +
                " is the sequential loop's for now: on actors the kernels choose per product, as --gemm auto "
                "does (leave --gemm out)");
  if (s_.accumulate > 1 && runs_on_actors(s_))
    throw error("--accumulate " + std::to_string(s_.accumulate) +
                " is the sequential loop's: on actors raise --batch-size (the asynchronous rules' --push-every K "
                "takes K local steps per push)");
  // AdamW on actors: the shards of asgd and sa-asgd apply it (model::validate(update_config) says so for the
  // others), and so do the flat optimizers of allreduce's replicas and of a pipeline's stages (model/flat_optimizer.hpp).
  const bool adam_shards = model::steps_by_adamw(s_.algo.kind) && s_.pipeline.stages == 1;
  const bool adam_flat = s_.algo.kind == algorithm_kind::allreduce || s_.algo.kind == algorithm_kind::sequential;
  if (s_.optimizer != optimizer_kind::sgd && runs_on_actors(s_) &&
      !adam_shards && !adam_flat)
    throw error("--optimizer " + std::string(to_string(s_.optimizer)) +
                " is the sequential loop's, the pipeline's, allreduce's and the asgd and sa-asgd shards': with --algorithm " +
                to_string(s_.algo.kind) + (s_.pipeline.stages > 1 ? " and pipeline stages" : "") +
" the algorithm's update rule applies (leave --optimizer out)");
}

} // namespace troupe
