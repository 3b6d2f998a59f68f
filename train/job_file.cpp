#include "train/job_file.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <cctype>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <optional>
#include <sstream>
#include <type_traits>

#include "data/dataset.hpp"
#include "model/update_rule.hpp"
#include "model/zoo.hpp"
#include "tensor/error.hpp"
#include "tensor/tensor.hpp"
#include "train/data_source.hpp"

namespace troupe::train {

namespace {

constexpr int64_t no_limit = std::numeric_limits<int64_t>::max();

// ---- values as text ----

// The shortest decimal that reads back to the same value.
template <class T>
std::string shortest(T x) {
  char buf[40];
  for (int p = 1; p <= std::numeric_limits<T>::max_digits10; ++p) {
    std::snprintf(buf, sizeof buf, "%.*g", p, static_cast<double>(x));
    if (static_cast<T>(std::strtod(buf, nullptr)) == x) break;
  }
  return buf;
}

// A number as a TOML float: "2.0", not "2" (which TOML reads as an integer).
template <class T>
std::string toml_float(T x) {
  std::string s = shortest(x);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";  // 'n': inf, nan
  return s;
}

std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char esc[8];
          std::snprintf(esc, sizeof esc, "\\u%04X", c);
          out += esc;
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

std::string toml_text(const job_value& v) {
  struct printer {
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const { return toml_float(static_cast<float>(d)); }
    std::string operator()(const std::string& s) const { return toml_string(s); }
    std::string operator()(const std::vector<double>& xs) const {
      std::string out = "[";
      for (std::size_t i = 0; i < xs.size(); ++i) out += (i ? ", " : "") + toml_float(static_cast<float>(xs[i]));
      return out + "]";
    }
  };
  return std::visit(printer{}, v);
}

// A value found in a job file, as the user wrote it, for errors.
std::string describe(const toml::node& n) {
  std::ostringstream os;
  if (auto* s = n.as_string()) return toml_string(s->get());
  if (auto* i = n.as_integer()) return std::to_string(i->get());
  if (auto* f = n.as_floating_point()) return toml_float(f->get());
  if (auto* b = n.as_boolean()) return b->get() ? "true" : "false";
  if (n.is_table()) return "a table";
  if (auto* a = n.as_array()) {
    std::string out = "[";
    for (std::size_t i = 0; i < a->size(); ++i) out += (i ? ", " : "") + describe((*a)[i]);
    return out + "]";
  }
  if (auto* d = n.as_date()) os << d->get();
  if (auto* t = n.as_time()) os << t->get();
  if (auto* dt = n.as_date_time()) os << dt->get();
  return os.str();
}

std::string join_choices(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

// ---- the key table ----

// Keys name their field with a generic lambda, `[](auto& s) -> auto& { return s.train.epochs; }`,
// which serves both set (job_spec&) and get (const job_spec&).
template <class F>
using field_type = std::remove_reference_t<decltype(std::declval<F>()(std::declval<job_spec&>()))>;

job_key make_key(std::string name, std::string value_name, std::string help, value_kind kind, std::string expected) {
  job_key k;
  k.name = std::move(name);
  k.value_name = std::move(value_name);
  k.help = std::move(help);
  k.kind = kind;
  k.expected = std::move(expected);
  return k;
}

template <class F>
job_key integer_key(std::string name, std::string value_name, std::string help, F field, int64_t lo,
                    int64_t hi = no_limit) {
  using T = field_type<F>;
  const auto top = static_cast<int64_t>(std::min<uint64_t>(static_cast<uint64_t>(hi), std::numeric_limits<T>::max()));
  std::string expected = hi == no_limit ? "an integer >= " + std::to_string(lo)
                                        : "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  job_key k = make_key(std::move(name), std::move(value_name), std::move(help), value_kind::integer, std::move(expected));
  k.set = [field, lo, top](job_spec& s, const job_value& v) {
    const int64_t x = std::get<int64_t>(v);
    if (x < lo || x > top) return false;
    field(s) = static_cast<T>(x);
    return true;
  };
  k.get = [field, name = k.name](const job_spec& s) -> job_value {
    const T x = field(s);
    if constexpr (std::is_unsigned_v<T>)
      if (x > static_cast<uint64_t>(no_limit))
        throw error(name + " = " + std::to_string(x) + " does not fit a job file: TOML integers stop at " +
                    std::to_string(no_limit));
    return static_cast<int64_t>(x);
  };
  return k;
}

// The values a number key accepts, all finite; `bounds` says which in words: "in [0, 1)".
struct range {
  double lo;
  bool lo_open;
  double hi;
  bool hi_open;
  std::string bounds;
  bool holds(double x) const {
    return std::isfinite(x) && std::abs(x) <= FLT_MAX && (lo_open ? x > lo : x >= lo) &&
           (hi_open ? x < hi : x <= hi);
  }
};
const double inf = std::numeric_limits<double>::infinity();
range positive() { return {0, true, inf, true, "> 0"}; }
range at_least(double lo) { return {lo, false, inf, true, ">= " + shortest(lo)}; }
range fraction() { return {0, false, 1, true, "in [0, 1)"}; }

// Numbers are stored as floats: the range is checked on the float, which a double may round into.
template <class F>
job_key number_key(std::string name, std::string value_name, std::string help, F field, const range& r) {
  job_key k = make_key(std::move(name), std::move(value_name), std::move(help), value_kind::number, "a number " + r.bounds);
  k.set = [field, r](job_spec& s, const job_value& v) {
    const double x = std::get<double>(v);
    if (!r.holds(x) || !r.holds(static_cast<float>(x))) return false;
    field(s) = static_cast<float>(x);
    return true;
  };
  k.get = [field](const job_spec& s) -> job_value { return static_cast<double>(field(s)); };
  return k;
}

template <class F>
job_key numbers_key(std::string name, std::string value_name, std::string help, F field, const range& each) {
  job_key k = make_key(std::move(name), std::move(value_name), std::move(help), value_kind::numbers,
                       "a list of numbers " + each.bounds);
  k.set = [field, each](job_spec& s, const job_value& v) {
    std::vector<float> out;
    for (double x : std::get<std::vector<double>>(v)) {
      if (!each.holds(x) || !each.holds(static_cast<float>(x))) return false;
      out.push_back(static_cast<float>(x));
    }
    field(s) = std::move(out);
    return true;
  };
  k.get = [field](const job_spec& s) -> job_value {
    const auto& xs = field(s);
    return std::vector<double>(xs.begin(), xs.end());
  };
  return k;
}

// A list of whole numbers >= lo, stored as ints.
template <class F>
job_key integers_key(std::string name, std::string value_name, std::string help, F field, int64_t lo) {
  job_key k = make_key(std::move(name), std::move(value_name), std::move(help), value_kind::numbers,
                       "a list of integers >= " + std::to_string(lo));
  k.set = [field, lo](job_spec& s, const job_value& v) {
    std::vector<int> out;
    for (double x : std::get<std::vector<double>>(v)) {
      if (!(x >= static_cast<double>(lo)) || x > 1e9 || x != static_cast<double>(static_cast<int64_t>(x))) return false;
      out.push_back(static_cast<int>(x));
    }
    field(s) = std::move(out);
    return true;
  };
  k.get = [field](const job_spec& s) -> job_value {
    const auto& xs = field(s);
    return std::vector<double>(xs.begin(), xs.end());
  };
  return k;
}

template <class F>
job_key text_key(std::string name, std::string value_name, std::string help, F field) {
  job_key k = make_key(std::move(name), std::move(value_name), std::move(help), value_kind::text, "a string");
  k.set = [field](job_spec& s, const job_value& v) {
    field(s) = std::get<std::string>(v);
    return true;
  };
  k.get = [field](const job_spec& s) -> job_value { return field(s); };
  return k;
}

template <class F>
job_key boolean_key(std::string name, std::string help, F field) {
  job_key k = make_key(std::move(name), "BOOL", std::move(help), value_kind::boolean, "true or false");
  k.set = [field](job_spec& s, const job_value& v) {
    field(s) = std::get<bool>(v);
    return true;
  };
  k.get = [field](const job_spec& s) -> job_value { return field(s); };
  return k;
}

// An enum, read with its parse_* function (train/job.hpp) and written with its to_string.
template <class E, class F>
job_key choice_key(std::string name, std::string value_name, std::string help, F field, E (*parse)(const std::string&),
                   const std::vector<E>& all) {
  std::vector<std::string> names;
  for (E e : all) names.emplace_back(to_string(e));
  job_key k = make_key(std::move(name), std::move(value_name), std::move(help), value_kind::text,
                       "one of " + join_choices(names));
  k.set = [field, parse](job_spec& s, const job_value& v) {
    try {
      field(s) = parse(std::get<std::string>(v));
    } catch (const error&) {
      return false;
    }
    return true;
  };
  k.get = [field](const job_spec& s) -> job_value { return std::string(to_string(field(s))); };
  return k;
}

/// Pipeline stages and their placement.
std::vector<job_key> make_pipeline_keys() {
  return {
      integer_key("pipeline-stages", "K", "cut the model into K pipeline stages, each an actor (default {default}: none)",
                  [](auto& s) -> auto& { return s.train.pipeline.stages; }, 1, 256),
      integer_key("micro-batches", "M", "micro-batches per mini-batch in a pipeline (default {default})",
                  [](auto& s) -> auto& { return s.train.pipeline.micro_batches; }, 1),
      choice_key("schedule", "NAME", "pipeline schedule: gpipe (a flush per mini-batch) or 1f1b (weight stashing) (default {default})",
                 [](auto& s) -> auto& { return s.train.pipeline.schedule; }, parse_pipeline_schedule,
                 all_pipeline_schedules()),
      integers_key("pipeline-cuts", "LIST", "the first layer of stages 2..K, e.g. 3,7 (default: cut by the layers' costs)",
                   [](auto& s) -> auto& { return s.train.pipeline.cuts; }, 1),
      integer_key("stash", "N", "1F1B: weight versions a stage keeps (default {default}: every one in flight)",
                  [](auto& s) -> auto& { return s.train.pipeline.stash; }, 0),
      choice_key("placement", "NAME",
                 "how stages are cut and placed on devices: even (balanced multiply-adds, default), random, greedy, "
                 "optimal (on measured layer times), manual (--pipeline-cuts, --stage-devices)",
                 [](auto& s) -> auto& { return s.train.pipeline.placement; }, parse_placement,
                 all_placements()),
      numbers_key("device-speeds", "LIST",
                  "relative speeds of the devices stages run on, e.g. 1,1,2,4 (emulated; default K devices of speed 1)",
                  [](auto& s) -> auto& { return s.train.pipeline.device_speeds; }, positive()),
      numbers_key("device-memory", "LIST", "memory limit of each device in MB, 0: none (default none)",
                  [](auto& s) -> auto& { return s.train.pipeline.device_memory_mb; }, at_least(0)),
      integers_key("stage-devices", "LIST", "manual placement: the device of each stage, e.g. 3,0,1,2",
                   [](auto& s) -> auto& { return s.train.pipeline.stage_devices; }, 0),
      numbers_key("link-cost", "A,B",
                  "the link between stages for the placer: A seconds per byte, B per message (bench/fit_link.sh "
                  "fits them; default 2.5e-10,2e-5: one process)",
                  [](auto& s) -> auto& { return s.train.pipeline.link_cost; }, at_least(0)),
      text_key("profile-cache", "FILE",
               "keep the layers' measured costs for the placer in FILE, read back by the next process that "
               "places the same model on this machine (troupe_plan, then the trainer), so that both place on "
               "the same costs (default: none, each process measures)",
               [](auto& s) -> auto& { return s.train.pipeline.profile_cache; }),
  };
}

/// --algorithm's choices, from the table of algorithms (train/job.cpp).
std::string algorithm_help() {
  std::string h = "sequential (default, one process, no actors)";
  for (algorithm_kind k : all_algorithms())
    if (k != algorithm_kind::sequential) h += std::string(", ") + to_string(k);
  return h;
}

const char* const shard_cut_help =
    "how shards cut the parameters: auto (default: on several nodes even when whole tensors would leave the largest "
    "shard over 1.25x an even share, else tensors), tensors (whole tensors, the largest shard as small as it can be) "
    "or even (equal ranges of elements, a large tensor cut across shards)";

/// `k`, read only by the jobs `applies` accepts (`to`: which, in words).
job_key only(job_key k, std::string to, std::function<bool(const job_spec&)> applies) {
  k.applies = std::move(applies);
  k.applies_to = std::move(to);
  return k;
}

const algorithm_traits& traits_of(const job_spec& s) { return traits(s.train.algo.kind); }

bool on_actors(const job_spec& s) { return runs_on_actors(s.train); }
const char* const on_actors_words = "a run on actors (an --algorithm other than sequential, or --pipeline-stages > 1)";

/// The algorithm and its distribution, in the order of --help.
std::vector<job_key> make_algorithm_keys() {
  const auto local_steps = [](const job_spec& s) { return s.train.algo.push_every > 1; };
  // The workers whose weight source can send during backward (worker_core::overlap): pushes every step to
  // shards, unclipped, or an allreduce's buckets; not Hogwild!'s shared buffer, nor a pipeline's stages.
  const auto pushes_in_backward = [](const job_spec& s) {
    const settings& t = s.train;
    if (!on_actors(s) || t.pipeline.stages > 1 || traits_of(s).shared_memory) return false;
    return traits_of(s).collective || (t.algo.push_every == 1 && t.clip_grad_norm <= 0);
  };
  const char* const pushes_in_backward_words =
      "a run of workers that push during backward (on actors, no pipeline, not hogwild; allreduce, or "
      "--push-every 1 without --clip-grad-norm)";
  return {
      choice_key("algorithm", "NAME", algorithm_help(),
                 [](auto& s) -> auto& { return s.train.algo.kind; }, parse_algorithm, all_algorithms()),
      integer_key("workers", "N", "worker actors, each with its own shard of the data (default {default})",
                  [](auto& s) -> auto& { return s.train.algo.workers; }, 1, 1024),
      integer_key("shards", "S", "parameter shards: contiguous ranges of the parameter layout, balanced by size (default {default})",
                  [](auto& s) -> auto& { return s.train.algo.shards; }, 1),
      choice_key("shard-cut", "CUT", shard_cut_help, [](auto& s) -> auto& { return s.train.algo.shard_cut; },
                 model::parse_shard_cut, model::all_shard_cuts()),
      integer_key("push-every", "K", "local steps per push; K > 1 pushes the accumulated change (default {default})",
                  [](auto& s) -> auto& { return s.train.algo.push_every; }, 1),
      only(number_key("worker-lr", "F", "worker optimizer's lr with --push-every > 1 (default {default} = --lr)",
                      [](auto& s) -> auto& { return s.train.algo.worker_lr; }, at_least(0)),
           "a job with --push-every > 1", local_steps),
      only(number_key("worker-momentum", "F", "worker optimizer's momentum with --push-every > 1 (default {default})",
                      [](auto& s) -> auto& { return s.train.algo.worker_momentum; }, fraction()),
           "a job with --push-every > 1", local_steps),
      numbers_key("worker-speeds", "LIST",
                  "relative speeds of the workers, larger is faster as in --device-speeds, e.g. 4,4,2,1: the "
                  "slower workers are slowed down to match (emulated; default all equal)",
                  [](auto& s) -> auto& { return s.train.algo.worker_speeds; }, positive()),
      only(integer_key("prefetch", "N", "batches a data loader keeps in flight per worker (default {default})",
                       [](auto& s) -> auto& { return s.train.algo.prefetch; }, 1),
           on_actors_words, on_actors),
      only(boolean_key("overlap",
                       "push each parameter shard's gradients as soon as backward has produced them, while it goes "
                       "on (pipelined execution), true or false (default {default}; false: linear execution)",
                       [](auto& s) -> auto& { return s.train.algo.overlap; }),
           pushes_in_backward_words, pushes_in_backward),
      only(boolean_key("overlap-receive",
                       "with --overlap true: the next forward pass runs each parameter shard's layers as soon as "
                       "that shard's weights arrive, and the first layers' pushes and weights go first on a link "
                       "(P3), true or false (default {default}; false: the forward pass waits for every shard)",
                       [](auto& s) -> auto& { return s.train.algo.overlap_receive; }),
           std::string("--overlap true in ") + pushes_in_backward_words,
           [pushes_in_backward](const job_spec& s) { return s.train.algo.overlap && pushes_in_backward(s); }),
  };
}

/// The keys of the update rules' constants and of the allreduce, each read by its algorithms only; after
/// make_algorithm_keys in --help.
std::vector<job_key> make_rule_keys() {
  const auto allreduce = [](const job_spec& s) { return traits_of(s).collective; };
  const auto kind_in = [](std::initializer_list<algorithm_kind> kinds) {
    return [v = std::vector<algorithm_kind>(kinds)](const job_spec& s) {
      return std::find(v.begin(), v.end(), s.train.algo.kind) != v.end();
    };
  };
  using k = algorithm_kind;
  return {
      only(number_key("dc-lambda", "F", "DC-ASGD-c: constant lambda (default {default})",
                      [](auto& s) -> auto& { return s.train.algo.lambda; }, at_least(0)),
           "--algorithm dc-asgd-c", kind_in({k::dc_asgd_c})),
      only(number_key("dc-lambda0", "F", "DC-ASGD-a, DDC-ASGD: lambda0 (default {default})",
                      [](auto& s) -> auto& { return s.train.algo.lambda0; }, at_least(0)),
           "--algorithm dc-asgd-a or ddc-asgd", kind_in({k::dc_asgd_a, k::ddc_asgd})),
      only(number_key("dc-rho-ms", "F", "DC-ASGD-a, DDC-ASGD: decay of the mean square (default {default})",
                      [](auto& s) -> auto& { return s.train.algo.rho_ms; }, fraction()),
           "--algorithm dc-asgd-a or ddc-asgd", kind_in({k::dc_asgd_a, k::ddc_asgd})),
      only(number_key("ddc-alpha", "F", "DDC-ASGD: trust rho(tau) = 1 / (1 + alpha tau) (default {default})",
                      [](auto& s) -> auto& { return s.train.algo.alpha; }, at_least(0)),
           "--algorithm ddc-asgd", kind_in({k::ddc_asgd})),
      only(number_key("ddc-mu0", "F", "DDC-ASGD: momentum mu(tau) = max(0, 1 - (1 - mu0)(1 + tau)) (default {default})",
                      [](auto& s) -> auto& { return s.train.algo.mu0; }, fraction()),
           "--algorithm ddc-asgd", kind_in({k::ddc_asgd})),
      only(integer_key("ddc-version", "V",
                       "DDC-ASGD's definition: 1 (default) or 2 (distrust only staleness above its running mean; "
                       "momentum mu0 less what asynchrony implies)",
                       [](auto& s) -> auto& { return s.train.algo.ddc_version; }, 1, 2),
           "--algorithm ddc-asgd", kind_in({k::ddc_asgd})),
      only(number_key("ddc-tau-decay", "F",
                      "DDC-ASGD v2: decay of the running mean of staleness per message (default {default})",
                      [](auto& s) -> auto& { return s.train.algo.tau_decay; }, fraction()),
           "--algorithm ddc-asgd", kind_in({k::ddc_asgd})),
      only(number_key("bucket-mb", "MB",
                      "allreduce: gradients go out in buckets of about MB megabytes, each as soon as backward has "
                      "filled it (default {default}; 0: one bucket after backward)",
                      [](auto& s) -> auto& { return s.train.algo.bucket_mb; }, at_least(0)),
           "--algorithm allreduce", allreduce),
      only(choice_key("allreduce-dtype", "TYPE",
                      "allreduce: the gradients travel as f32 (default) or bf16 (half the bytes; summed in float32)",
                      [](auto& s) -> auto& { return s.train.algo.allreduce_dtype; }, parse_reduce_dtype,
                      all_reduce_dtypes()),
           "--algorithm allreduce", allreduce),
  };
}

/// The optimizer and its schedule, in the order of --help.
std::vector<job_key> make_optimizer_keys() {
  using model::lr_schedule;
  return {
      number_key("lr", "F", "learning rate (default {default})", [](auto& s) -> auto& { return s.train.lr; }, positive()),
      number_key("momentum", "F", "SGD momentum in [0, 1) (default {default})",
                 [](auto& s) -> auto& { return s.train.momentum; }, fraction()),
      number_key("clip-grad-norm", "F",
                 "clip each step's gradient to this global L2 norm, the whole model's (default {default}: none; every "
                 "mode but a hybrid's stages)",
                 [](auto& s) -> auto& { return s.train.clip_grad_norm; }, at_least(0)),
      number_key("weight-decay", "F", "weight decay: L2 for sgd, decoupled for adamw (default {default}; gpt 0.01)",
                 [](auto& s) -> auto& { return s.train.weight_decay; }, at_least(0)),
      choice_key("optimizer", "NAME",
                 "sgd (with --momentum) or adamw: in the sequential loop, pipelines, allreduce and at the shards of "
                 "asgd and sa-asgd (default {default}; gpt adamw but under the asynchronous rules)",
                 [](auto& s) -> auto& { return s.train.optimizer; }, parse_optimizer, all_optimizers()),
      choice_key("gemm", "NAME",
                 "the sequential loop's matrix products: auto (troupe's kernels where they measured faster, "
                 "OpenBLAS elsewhere), openblas, eigen or own (troupe's kernels) (default {default})",
                 [](auto& s) -> auto& { return s.train.gemm; }, kernels::parse_gemm_backend,
                 std::vector<kernels::gemm_backend>{kernels::gemm_backend::automatic, kernels::gemm_backend::openblas,
                                                    kernels::gemm_backend::eigen, kernels::gemm_backend::own}),
      choice_key("lr-schedule", "NAME", "cosine (decays to 0 over the run) or constant (default {default})",
                 [](auto& s) -> auto& { return s.train.schedule; }, parse_schedule,
                 std::vector<lr_schedule>{lr_schedule::constant, lr_schedule::cosine}),
      integer_key("warmup-steps", "N",
                  "linear warm-up of the lr over the first N steps, then --lr-schedule over the rest (default {default})",
                  [](auto& s) -> auto& { return s.train.warmup_steps; }, 0),
      integer_key("accumulate", "N",
                  "the sequential loop's batches per optimizer step: their gradients averaged, as one batch of N x "
                  "--batch-size, with one batch's memory (default {default})",
                  [](auto& s) -> auto& { return s.train.accumulate; }, 1, 4096),
  };
}

/// Whether `s` trains a language model (its model is one of language_model_names()).
bool language_model(const job_spec& s) {
  const auto& lms = language_model_names();
  return std::find(lms.begin(), lms.end(), s.model) != lms.end();
}

/// --trace, last in --help: the timeline of a run on actors.
job_key trace_key() {
  return only(text_key("trace", "FILE", "write the run's timeline (Chrome trace JSON, opens in Perfetto) to FILE",
                       [](auto& s) -> auto& { return s.train.trace; }),
              on_actors_words, on_actors);
}

/// The language model's keys, after --data-dir in --help: its windows and its size.
std::vector<job_key> make_language_model_keys() {
  const auto gpt = [](job_key k) { return only(std::move(k), "--model gpt", language_model); };
  return {
      gpt(integer_key("context", "N", "gpt: tokens (bytes) per training window (default {default})",
                      [](auto& s) -> auto& { return s.context; }, 1, 4096)),
      gpt(integer_key("dim", "N", "gpt: features per token, the width of its embeddings and blocks (default {default})",
                      [](auto& s) -> auto& { return s.dim; }, 1, 8192)),
      gpt(integer_key("heads", "N", "gpt: attention heads per block, a divisor of --dim (default {default})",
                      [](auto& s) -> auto& { return s.heads; }, 1, 1024)),
      gpt(integer_key("blocks", "N", "gpt: transformer blocks (default {default})",
                      [](auto& s) -> auto& { return s.blocks; }, 0, 1024)),
      gpt(integer_key("mlp-ratio", "N", "gpt: a block's MLP width as a multiple of --dim (default {default})",
                      [](auto& s) -> auto& { return s.mlp_ratio; }, 1, 64)),
  };
}

std::vector<job_key> make_keys() {
  using model::lr_schedule;
  std::vector<job_key> keys{
      text_key("model", "NAME", "mlp, cnn, resnet or gpt (a character-level language model; other defaults, "
               "see README) (default {default})", [](auto& s) -> auto& { return s.model; }),
      integer_key("epochs", "N", "passes over the training set (default {default})",
                  [](auto& s) -> auto& { return s.train.epochs; }, 1),
      integer_key("batch-size", "N", "samples per step (default {default})",
                  [](auto& s) -> auto& { return s.train.batch_size; }, 1),
      integer_key("seed", "N", "seed for initialisation and shuffling (default {default})",
                  [](auto& s) -> auto& { return s.train.seed; }, 0),
      integer_key("threads", "N",
                  "CPU threads; 0: this process's share of the cores (Slurm's CPUs per task, else its CPUs divided by "
                  "the processes on its host) (default {default})",
                  [](auto& s) -> auto& { return s.train.threads; }, 0),
      text_key("data-dir", "DIR",
               "directory with the IDX files (default " + data::default_fashion_mnist_dir() +
                   "); gpt: a text file or a directory of them (default " + data::default_text_dir() + ")",
               [](auto& s) -> auto& { return s.data_dir; }),
      text_key("checkpoint", "FILE", "resume from FILE if it exists; save to it after every epoch",
               [](auto& s) -> auto& { return s.train.checkpoint; }),
      integer_key("checkpoint-every-steps", "N", "also save the checkpoint every N steps (default {default} = per epoch only)",
                  [](auto& s) -> auto& { return s.train.checkpoint_every_steps; }, 0),
      number_key("checkpoint-every-seconds", "S",
                 "also save the checkpoint every S seconds (default {default} = per epoch only)",
                 [](auto& s) -> auto& { return s.train.checkpoint_every_s; }, at_least(0)),
      text_key("metrics-out", "FILE", "write one JSON record per epoch to FILE (JSON Lines)",
               [](auto& s) -> auto& { return s.train.metrics_out; }),
      integer_key("max-steps", "N", "stop after N optimizer steps (default {default} = no limit)",
                  [](auto& s) -> auto& { return s.train.max_steps; }, 0),
      only(integer_key("sample-tokens", "N",
                       "gpt: after every epoch, N tokens sampled after a newline, printed and in the record "
                       "(default {default} = none)",
                       [](auto& s) -> auto& { return s.train.sample_tokens; }, 0, 100000),
           "--model gpt", language_model),
      number_key("validation-fraction", "F",
                 "hold out the last F of the training set as a validation set, scored after every epoch "
                 "(default {default} = none)",
                 [](auto& s) -> auto& { return s.train.validation_fraction; }, fraction()),
      boolean_key("evaluate", "test accuracy after every epoch, true or false (default {default})",
                  [](auto& s) -> auto& { return s.train.evaluate; }),
      choice_key("progress", "MODE", "auto (a bar on a terminal), bar, lines or none (default {default})",
                 [](auto& s) -> auto& { return s.train.progress; }, parse_progress,
                 std::vector<progress_mode>{progress_mode::automatic, progress_mode::bar, progress_mode::lines,
                                            progress_mode::none}),
  };
  std::vector<job_key> lm_keys = make_language_model_keys();
  const auto data_dir = std::find_if(keys.begin(), keys.end(), [](const job_key& k) { return k.name == "data-dir"; });
  keys.insert(data_dir + 1, std::make_move_iterator(lm_keys.begin()), std::make_move_iterator(lm_keys.end()));
  std::vector<job_key> optimizer_keys = make_optimizer_keys();
  keys.insert(keys.begin() + 3, std::make_move_iterator(optimizer_keys.begin()),
              std::make_move_iterator(optimizer_keys.end()));  // after model, epochs and batch-size
  for (job_key& key : make_algorithm_keys()) keys.push_back(std::move(key));
  for (job_key& key : make_rule_keys()) keys.push_back(std::move(key));
  for (job_key& key : make_pipeline_keys()) keys.push_back(std::move(key));
  keys.push_back(trace_key());
  return keys;
}

std::vector<job_key> make_cluster_keys() {
  return {
      text_key("secret-file", "FILE",
               "the nodes' shared secret: a file of random bytes, mode 0600 (needed with several nodes)",
               [](auto& s) -> auto& { return s.cluster.secret_file; }),
      number_key("join-timeout", "S", "seconds every node has to join (default {default})",
                 [](auto& s) -> auto& { return s.cluster.join_timeout_s; }, positive()),
      number_key("peer-timeout", "S", "a peer silent this many seconds is dead (default {default})",
                 [](auto& s) -> auto& { return s.cluster.peer_timeout_s; }, positive()),
      number_key("heartbeat", "S", "seconds between heartbeats on every link (default {default})",
                 [](auto& s) -> auto& { return s.cluster.heartbeat_s; }, positive()),
      integer_key("slurm-port", "PORT", "under srun, task i listens on slurm-port + i (default {default})",
                  [](auto& s) -> auto& { return s.cluster.slurm_port; }, 1, 65535),
      boolean_key("encrypt",
                  "encrypt the payload of every frame between nodes (AES-256-GCM); every frame is authenticated "
                  "either way (default {default})",
                  [](auto& s) -> auto& { return s.cluster.encrypt; }),
      integer_key("lane-mb", "MB",
                  "nodes on one host send messages of 64 KiB or more through a region of shared memory this "
                  "large per peer instead of their sockets; 0: never (default {default})",
                  [](auto& s) -> auto& { return s.cluster.lane_mb; }, 0, 4096),
  };
}

// A table of a job file and the keys it holds: the top level and [cluster].
struct section {
  std::string name;  // "" for the top level
  const std::vector<job_key>& keys;
};

const std::vector<section>& sections() {
  static const std::vector<section> all{{"", job_keys()}, {"cluster", cluster_keys()}};
  return all;
}

const section* find_section(const std::string& name) {
  for (const section& s : sections())
    if (!s.name.empty() && s.name == name) return &s;
  return nullptr;
}

const job_key* find_in(const std::vector<job_key>& keys, const std::string& name) {
  for (const job_key& k : keys)
    if (k.name == name) return &k;
  return nullptr;
}

// ---- reading ----

std::string at(const std::string& path, const toml::source_region& where) {
  if (where.begin.line == 0) return path + ": ";
  return path + ":" + std::to_string(where.begin.line) + ": ";
}

std::optional<double> number_of(const toml::node& n) {
  if (auto* i = n.as_integer()) return static_cast<double>(i->get());
  if (auto* f = n.as_floating_point()) return f->get();
  return std::nullopt;
}

// The value of `n` as `kind`, or nothing when the TOML type does not fit.
std::optional<job_value> from_toml(const toml::node& n, value_kind kind) {
  switch (kind) {
    case value_kind::boolean:
      if (auto* b = n.as_boolean()) return job_value(b->get());
      break;
    case value_kind::integer:
      if (auto* i = n.as_integer()) return job_value(i->get());
      break;
    case value_kind::number:
      if (auto x = number_of(n)) return job_value(*x);
      break;
    case value_kind::text:
      if (auto* s = n.as_string()) return job_value(s->get());
      break;
    case value_kind::numbers:
      if (auto* a = n.as_array()) {
        std::vector<double> xs;
        for (const toml::node& e : *a) {
          auto x = number_of(e);
          if (!x) return std::nullopt;
          xs.push_back(*x);
        }
        return job_value(std::move(xs));
      }
      break;
  }
  return std::nullopt;
}

std::string unknown_entry(const std::string& prefix, const std::string& name, const toml::node& n, const section& sec) {
  std::vector<std::string> candidates;
  for (const job_key& k : sec.keys) candidates.push_back(k.name);
  if (sec.name.empty())
    for (const section& s : sections())
      if (!s.name.empty()) candidates.push_back(s.name);
  std::string out = std::string("unknown ") + (n.is_table() ? "table" : "key") + " '" + prefix + name + "'";
  std::string close = closest_name(name, candidates);
  return close.empty() ? out : out + " (did you mean '" + close + "'?)";
}

void apply_nodes(job_spec& spec, const toml::node& nodes, const std::string& path);

void apply_table(job_spec& spec, const toml::table& table, const section& sec, const std::string& path) {
  const std::string prefix = sec.name.empty() ? "" : sec.name + ".";
  for (auto&& [k, node] : table) {
    const std::string name(k.str());
    if (sec.name == "cluster" && name == "nodes") {
      apply_nodes(spec, node, path);
      continue;
    }
    if (const job_key* key = find_in(sec.keys, name)) {
      auto v = from_toml(node, key->kind);
      if (!v || !key->set(spec, *v))
        throw error(at(path, node.source()) + prefix + name + ": expected " + key->expected + ", got " +
                    describe(node));
      continue;
    }
    if (sec.name.empty()) {
      std::vector<double> values;
      if (auto v = from_toml(node, value_kind::numbers)) values = std::get<std::vector<double>>(*v);
      if (std::string retired = retired_key(name, values, false); !retired.empty())
        throw error(at(path, k.source()) + retired);
    }
    const section* sub = sec.name.empty() ? find_section(name) : nullptr;
    if (sub && node.is_table()) {
      apply_table(spec, *node.as_table(), *sub, path);
      continue;
    }
    throw error(at(path, k.source()) + unknown_entry(prefix, name, node, sec));
  }
}

// ---- the [cluster] table's nodes ----

// The fields of one node (and of its devices), read from an inline table or a [[cluster.nodes]] table.
template <class T>
T field_of(const toml::table& t, const std::string& key, T fallback, const std::string& path, const std::string& where,
           const char* expected) {
  const toml::node* n = t.get(key);
  if (!n) return fallback;
  if constexpr (std::is_same_v<T, bool>) {
    if (auto* b = n->as_boolean()) return b->get();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (auto* s = n->as_string()) return s->get();
  } else if constexpr (std::is_integral_v<T>) {
    if (auto* i = n->as_integer()) return static_cast<T>(i->get());
  } else {
    if (auto x = number_of(*n)) return static_cast<T>(*x);
  }
  throw error(at(path, n->source()) + where + "." + key + ": expected " + expected + ", got " + describe(*n));
}

void only_keys(const toml::table& t, const std::vector<std::string>& keys, const std::string& path,
               const std::string& where) {
  for (auto&& [k, v] : t) {
    const std::string name(k.str());
    if (std::find(keys.begin(), keys.end(), name) == keys.end()) {
      const std::string close = closest_name(name, keys);
      throw error(at(path, k.source()) + "unknown key '" + where + "." + name + "'" +
                  (close.empty() ? "" : " (did you mean '" + close + "'?)"));
    }
  }
}

device_spec read_device(const toml::node& n, const std::string& path, const std::string& where) {
  const toml::table* t = n.as_table();
  if (!t) throw error(at(path, n.source()) + where + ": expected a table { kind = \"cpu\", speed = 1.0, memory-mb = 0 }");
  only_keys(*t, {"kind", "speed", "memory-mb"}, path, where);
  device_spec d;
  d.kind = field_of<std::string>(*t, "kind", d.kind, path, where, "a string");
  d.speed = field_of<double>(*t, "speed", d.speed, path, where, "a number");
  d.memory_mb = field_of<int64_t>(*t, "memory-mb", d.memory_mb, path, where, "an integer");
  return d;
}

node_entry read_node(const toml::node& n, const std::string& path, const std::string& where) {
  const toml::table* t = n.as_table();
  if (!t) throw error(at(path, n.source()) + where + ": expected a table { name = ..., host = ..., port = ... }");
  only_keys(*t, {"name", "host", "port", "workers", "shards", "threads", "devices"}, path, where);
  node_entry e;
  e.name = field_of<std::string>(*t, "name", "", path, where, "a string");
  if (e.name.empty()) throw error(at(path, n.source()) + where + ": a node needs a name");
  e.host = field_of<std::string>(*t, "host", e.host, path, where, "a string");
  const int64_t port = field_of<int64_t>(*t, "port", 0, path, where, "an integer in [1, 65535]");
  if (port < 0 || port > 65535)
    throw error(at(path, t->get("port")->source()) + where + ".port: expected an integer in [1, 65535], got " +
                std::to_string(port));
  e.port = static_cast<uint16_t>(port);
  e.workers = field_of<bool>(*t, "workers", e.workers, path, where, "true or false");
  e.shards = field_of<bool>(*t, "shards", e.shards, path, where, "true or false");
  e.threads = field_of<int>(*t, "threads", e.threads, path, where, "an integer >= 0");
  if (const toml::node* d = t->get("devices")) {
    const toml::array* a = d->as_array();
    if (!a) throw error(at(path, d->source()) + where + ".devices: expected an array of tables");
    for (std::size_t i = 0; i < a->size(); ++i)
      e.devices.push_back(read_device(*a->get(i), path, where + ".devices[" + std::to_string(i) + "]"));
  }
  return e;
}

void apply_nodes(job_spec& spec, const toml::node& nodes, const std::string& path) {
  const toml::array* a = nodes.as_array();
  if (!a)
    throw error(at(path, nodes.source()) +
                "cluster.nodes: expected an array of tables, e.g. nodes = [{ name = \"a\", port = 7001 }]");
  spec.cluster.nodes.clear();
  for (std::size_t i = 0; i < a->size(); ++i)
    spec.cluster.nodes.push_back(read_node(*a->get(i), path, "cluster.nodes[" + std::to_string(i) + "]"));
}

std::string nodes_text(const std::vector<node_entry>& nodes) {
  std::string out = "nodes = [";
  for (const node_entry& n : nodes) {
    out += "\n  { name = " + toml_string(n.name) + ", host = " + toml_string(n.host) + ", port = " +
           std::to_string(n.port) + ", workers = " + (n.workers ? "true" : "false") +
           ", shards = " + (n.shards ? "true" : "false") + ", threads = " + std::to_string(n.threads) + ", devices = [";
    for (std::size_t i = 0; i < n.devices.size(); ++i)
      out += std::string(i ? ", " : "") + "{ kind = " + toml_string(n.devices[i].kind) + ", speed = " +
             toml_float(n.devices[i].speed) + ", memory-mb = " + std::to_string(n.devices[i].memory_mb) + " }";
    out += "] },";
  }
  return out + (nodes.empty() ? "]" : "\n]") + "\n";
}

void apply_job_text(job_spec& spec, const std::string& text, const std::string& path) {
  toml::table table;
  try {
    table = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    throw error(path + ":" + std::to_string(b.line) + ":" + std::to_string(b.column) +
                ": not valid TOML: " + std::string(e.description()));
  }
  apply_table(spec, table, sections().front(), path);
}

std::string read_text(const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty()) throw error("no job file given (the path is empty)");
  std::error_code ec;
  const bool exists = fs::exists(path, ec);
  if (ec) throw error("cannot read job file " + path + ": " + ec.message());
  if (!exists) throw error("job file " + path + " does not exist");
  if (fs::is_directory(path, ec)) throw error("job file " + path + " is a directory, not a TOML file");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw error("cannot read job file " + path + ": " + std::strerror(errno));
  std::ostringstream text;
  text << f.rdbuf();
  if (f.bad()) throw error("cannot read job file " + path + ": " + std::strerror(errno));
  return text.str();
}

void validate_in(const job_spec& spec, const std::string& path) {
  try {
    validate(spec);
  } catch (const error& e) {
    throw error(path + ": " + e.what());
  }
}

// ---- reading the command line's text ----

// A number, spaces around it allowed ("1, 2" in a list).
std::optional<double> number_of(const std::string& text) {
  const std::size_t b = text.find_first_not_of(' '), e = text.find_last_not_of(' ');
  if (b == std::string::npos) return std::nullopt;
  const std::string t = text.substr(b, e - b + 1);
  char* end = nullptr;
  const double x = std::strtod(t.c_str(), &end);
  if (*end != '\0' || std::isspace(static_cast<unsigned char>(t[0]))) return std::nullopt;
  return x;
}

std::optional<int64_t> integer_of(const std::string& text) {
  if (text.empty() || !(std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '-' || text[0] == '+'))
    return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(text.c_str(), &end, 10);
  if (*end != '\0' || errno != 0) return std::nullopt;
  return static_cast<int64_t>(x);
}

// The value of `text` as `kind`, or nothing when it is not one: "1,1,2,4" for numbers, "" for none.
std::optional<job_value> from_text(const std::string& text, value_kind kind) {
  switch (kind) {
    case value_kind::boolean:
      if (text == "true" || text == "yes" || text == "on" || text == "1") return job_value(true);
      if (text == "false" || text == "no" || text == "off" || text == "0") return job_value(false);
      break;
    case value_kind::integer:
      if (auto x = integer_of(text)) return job_value(*x);
      break;
    case value_kind::number:
      if (auto x = number_of(text)) return job_value(*x);
      break;
    case value_kind::text: return job_value(text);
    case value_kind::numbers: {
      std::vector<double> xs;
      for (std::size_t pos = 0; !text.empty() && pos <= text.size();) {
        const std::size_t comma = std::min(text.find(',', pos), text.size());
        auto x = number_of(text.substr(pos, comma - pos));
        if (!x) return std::nullopt;
        xs.push_back(*x);
        pos = comma + 1;
      }
      return job_value(std::move(xs));
    }
  }
  return std::nullopt;
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

} // namespace

namespace {

/// A default as --help shows it: 0.02, 60, true, cnn (a job file's text, but
/// numbers in their shortest form and words unquoted).
std::string help_value(const job_value& v) {
  if (const auto* s = std::get_if<std::string>(&v)) return *s;
  if (const auto* d = std::get_if<double>(&v)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", *d);
    return buf;
  }
  return toml_text(v);
}

/// `keys` with "{default}" in each help replaced by the key's value in a
/// default job_spec: the settings' initializers are the one place a default
/// is written, and --help and the job file's comments say what they hold.
std::vector<job_key> with_defaults(std::vector<job_key> keys) {
  const job_spec defaults;
  for (job_key& k : keys)
    for (std::size_t at; (at = k.help.find("{default}")) != std::string::npos;)
      k.help.replace(at, 9, help_value(k.get(defaults)));
  return keys;
}

} // namespace

const std::vector<job_key>& cluster_keys() {
  static const std::vector<job_key> keys = with_defaults(make_cluster_keys());
  return keys;
}

const std::vector<job_key>& job_keys() {
  static const std::vector<job_key> keys = with_defaults(make_keys());
  return keys;
}

const job_key* find_job_key(const std::string& name) { return find_in(job_keys(), name); }

void check_ranges(const settings& s) {
  job_spec spec;
  spec.train = s;
  for (const job_key& k : job_keys()) {
    job_value v;
    try {
      v = k.get(spec);
    } catch (const error&) {
      continue;  // a value no job file can hold (a seed past TOML's integers) has no range to check
    }
    job_spec copy = spec;
    if (!k.set(copy, v)) throw error("--" + k.name + ": expected " + k.expected + ", got " + toml_text(v));
  }
}

std::vector<std::string> unread_keys(const job_spec& spec) {
  const job_spec defaults = defaults_for(spec);
  std::vector<std::string> notes;
  for (const job_key& k : job_keys()) {
    if (!k.applies || k.applies(spec)) continue;
    const job_value v = k.get(spec);
    if (v == k.get(defaults)) continue;
    const std::string* text = std::get_if<std::string>(&v);
    notes.push_back("--" + k.name + " " + (text ? *text : toml_text(v)) + " has no effect: only " + k.applies_to +
                    " reads it");
  }
  return notes;
}

std::string retired_key(const std::string& name, const std::vector<double>& values, bool option) {
  if (name != "speeds") return "";
  std::vector<double> slowdowns = values;
  const bool usable = !slowdowns.empty() && std::all_of(slowdowns.begin(), slowdowns.end(), [](double x) {
    return std::isfinite(x) && x >= 1 && x <= FLT_MAX;
  });
  if (!usable) slowdowns = {1, 1, 2, 4};
  const double slowest = *std::max_element(slowdowns.begin(), slowdowns.end());
  std::vector<double> speeds;
  for (double x : slowdowns) speeds.push_back(slowest / x);
  auto list = [option](const std::vector<double>& xs) {
    std::string out;
    for (std::size_t i = 0; i < xs.size(); ++i) out += (i ? (option ? "," : ", ") : "") + shortest(static_cast<float>(xs[i]));
    return option ? out : "[" + out + "]";
  };
  const std::string dash = option ? "--" : "", is = option ? " " : " = ";
  return dash + "speeds was replaced by " + dash + "worker-speeds, where larger is faster as in " + dash +
         "device-speeds: " + dash + "speeds" + is + list(slowdowns) + " is " + dash + "worker-speeds" + is +
         list(speeds) + " (each worker's speed is the largest slowdown over its own)";
}

std::string closest_name(const std::string& name, const std::vector<std::string>& names) {
  std::string best;
  std::size_t best_distance = 3;  // farther than 2 edits is a different word
  for (const std::string& n : names) {
    const std::size_t d = edit_distance(name, n);
    if (d < best_distance && d < n.size()) {
      best = n;
      best_distance = d;
    }
  }
  return best;
}

void set_from_text(job_spec& spec, const job_key& key, const std::string& text) {
  auto v = from_text(text, key.kind);
  if (!v || !key.set(spec, *v)) throw error("--" + key.name + ": expected " + key.expected + ", got '" + text + "'");
}

void apply_job_file(job_spec& spec, const std::string& path) { apply_job_text(spec, read_text(path), path); }

const std::vector<std::string>& language_model_names() {
  static const std::vector<std::string> names{"gpt"};
  return names;
}

/// A language model's defaults: AdamW wherever the whole model takes the
/// sequential loop's step (the loop, allreduce, a pipeline, a hybrid by
/// allreduce); under the asynchronous rules (whose shards apply their own
/// SGD step) momentum SGD at a learning rate for it.
job_spec language_model_defaults(const job_spec& given) {
  job_spec s;
  s.model = given.model;
  s.train.batch_size = 32;
  s.train.epochs = 2;
  const algorithm_kind k = given.train.algo.kind;
  if (k != algorithm_kind::sequential && k != algorithm_kind::allreduce) {
    s.train.lr = 0.05f;
    s.train.momentum = 0.9f;
    return s;
  }
  s.train.optimizer = optimizer_kind::adamw;
  s.train.lr = 1e-3f;
  s.train.weight_decay = 0.01f;
  return s;
}

job_spec defaults_for(const job_spec& given) {
  return language_model(given) ? language_model_defaults(given) : job_spec{};
}

void check_language_model_size(const job_spec& spec, double memory_bytes) {
  if (spec.dim % spec.heads != 0)
    throw error("--heads " + std::to_string(spec.heads) + " does not divide --dim " + std::to_string(spec.dim) +
                ": each head takes dim / heads features");
  // Weights, gradients and the optimizer's state (AdamW: two moments, SGD: the velocity if any), for a byte
  // vocabulary of at most 256, and the attention probabilities each block keeps for backward
  // ([batch, heads, context, context] floats): a floor under what one replica's step needs.
  const double params = zoo::gpt_parameters(256, spec.context, spec.dim, spec.blocks, spec.mlp_ratio);
  const double c = static_cast<double>(spec.context);
  const double probs = static_cast<double>(spec.blocks) * static_cast<double>(spec.train.batch_size) *
                       static_cast<double>(spec.heads) * c * c * 4;
  const int copies = spec.train.optimizer == optimizer_kind::adamw ? 4 : spec.train.momentum > 0 ? 3 : 2;
  const double bytes = params * 4 * copies + probs;
  if (memory_bytes <= 0 || bytes <= memory_bytes) return;
  const auto figure = [](double x) {  // about 3 significant digits, never an exponent
    std::ostringstream o;
    o << std::fixed << std::setprecision(x >= 100 ? 0 : x >= 10 ? 1 : x >= 1 ? 2 : 3) << x;
    return o.str();
  };
  throw error("--dim " + std::to_string(spec.dim) + ", --heads " + std::to_string(spec.heads) + ", --blocks " +
              std::to_string(spec.blocks) + ", --mlp-ratio " + std::to_string(spec.mlp_ratio) + ", --context " +
              std::to_string(spec.context) + " and --batch-size " + std::to_string(spec.train.batch_size) +
              " make a gpt of about " + figure(params / 1e6) + " M parameters whose step needs at least " +
              figure(bytes / 1e9) + " GB (" + figure((bytes - probs) / 1e9) +
              " for the weights, gradients and optimizer state, " + figure(probs / 1e9) +
              " for the attention probabilities), more than this machine's " + figure(memory_bytes / 1e9) +
              " GB of memory");
}

void validate(const job_spec& spec) {
  std::vector<std::string> models = zoo::names();
  for (const std::string& m : language_model_names()) models.push_back(m);
  if (std::find(models.begin(), models.end(), spec.model) == models.end())
    throw error("unknown model '" + spec.model + "' (choose " + join_choices(models) + ")");
  troupe::validate(spec.train);
  validate(spec.cluster);
  if (language_model(spec)) check_language_model_size(spec, physical_memory_bytes());
  if (traits(spec.train.algo.kind).shared_memory && !spec.cluster.single_process())
    throw error("--algorithm hogwild shares one buffer in one process: it cannot run on a cluster of " +
                std::to_string(spec.cluster.nodes.size()) + " nodes");
}

job_spec read_job_file(const std::string& path, job_spec base) {
  apply_job_file(base, path);
  validate_in(base, path);
  return base;
}

job_spec parse_job_file(const std::string& text, const std::string& path, job_spec base) {
  apply_job_text(base, text, path);
  validate_in(base, path);
  return base;
}

std::string to_job_file(const job_spec& spec) {
  std::string out =
      "# A troupe job file: troupe_trainer --config FILE reads it, and every key is also an option (--key value).\n";
  for (const section& sec : sections()) {
    if (!sec.name.empty()) out += "\n[" + sec.name + "]\n";
    for (const job_key& k : sec.keys) {
      std::string line = k.name + " = " + toml_text(k.get(spec));
      line.resize(std::max<std::size_t>(line.size() + 2, 32), ' ');
      out += line + "# " + k.help + "\n";
    }
    if (sec.name == "cluster") out += nodes_text(spec.cluster.nodes);
  }
  return out;
}

troupe::job make_job(const job_spec& spec) {
  validate(spec);
  const std::string name = spec.model;
  troupe::job j;
  if (name == "gpt") {
    const int64_t context = spec.context;
    j.model([context, dim = spec.dim, heads = spec.heads, blocks = spec.blocks, ratio = spec.mlp_ratio](
                int64_t vocab) { return zoo::gpt(vocab, context, dim, heads, blocks, ratio); },
            name)
        .data(spec.data_dir.empty() ? data::fortunes(context) : data::text_file(spec.data_dir, context));
  } else {
    j.model([name] { return zoo::by_name(name); }, name)
        .data(spec.data_dir.empty() ? data::fashion_mnist() : data::idx_dir(spec.data_dir));
  }
  j.configure(spec.train).cluster(spec.cluster);
  return j;
}

} // namespace troupe::train
