#pragma once

// Job files: a job's model, data and settings as TOML, the same keys as the
// trainer's command line (train/cli.hpp) without the leading dashes:
//
//   # job.toml
//   model = "cnn"
//   algorithm = "ddc-asgd"
//   workers = 4
//   worker-speeds = [4, 4, 2, 1]
//
//   auto spec = troupe::train::read_job_file("job.toml");
//   troupe::fit(troupe::train::make_job(spec));

#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "train/cluster.hpp"
#include "train/job.hpp"

namespace troupe::train {

/// What a job file and the trainer's command line hold: a zoo model, the data directory, every setting.
struct job_spec {
  std::string model = "cnn";  ///< zoo model (model/zoo.hpp): mlp, cnn, resnet or gpt (a language model)
  /// IDX files; empty: Debian's Fashion-MNIST (data::default_fashion_mnist_dir()). For gpt: a text file
  /// or a directory of them; empty: Debian's fortunes (data::default_text_dir()).
  std::string data_dir;
  settings train;
  cluster_spec cluster;       ///< the [cluster] table: the nodes of the run (none: this process alone)
  int64_t context = 128;      ///< gpt: tokens per window
  int64_t dim = 128;          ///< gpt: features per token (zoo::gpt's dim)
  int64_t heads = 4;          ///< gpt: attention heads per block; they divide dim
  int64_t blocks = 4;         ///< gpt: transformer blocks
  int64_t mlp_ratio = 4;      ///< gpt: a block's MLP width over dim
};

/// Reads a TOML job file on top of `base` (keys absent from the file keep base's values), then
/// validates the result. Throws troupe::error naming the file, and the line and key where there is one.
job_spec read_job_file(const std::string& path, job_spec base = {});
/// The same from TOML text; `path` names it in errors.
job_spec parse_job_file(const std::string& text, const std::string& path, job_spec base = {});
/// The effective job as a TOML job file that read_job_file accepts again: every key, each with a
/// one-line comment. Throws troupe::error for a seed above 2^63 - 1, which TOML cannot hold.
std::string to_job_file(const job_spec& spec);
/// A job from a spec: the zoo model (by name) and IDX data (data_dir, or troupe::data::fashion_mnist());
/// for gpt, zoo::gpt(the corpus's vocabulary, context, dim, heads, blocks, mlp_ratio) on text (data_dir, or troupe::data::fortunes()).
/// Validates the spec first.
troupe::job make_job(const job_spec& spec);

/// Throws troupe::error when the gpt `spec` asks for cannot be: its heads do not divide its width, or
/// its weights, gradients and optimizer state and the attention probabilities its blocks keep for a
/// batch need more than `memory_bytes` (0: not checked).
/// validate() calls it for a language model with the host's physical memory.
void check_language_model_size(const job_spec& spec, double memory_bytes);

/// The language models of the trainer (beside zoo::names()): "gpt".
const std::vector<std::string>& language_model_names();
/// The defaults a job file and the command line start from for the model
/// `given` names: job_spec{}, and for gpt a language model's (AdamW in the
/// sequential loop; momentum SGD's learning rate where `given`'s algorithm or
/// stages run on actors). The keys a file or the options give override them.
job_spec defaults_for(const job_spec& given);
/// defaults_for a job of `model` in the sequential loop.
inline job_spec defaults_for(const std::string& model) {
  job_spec given;
  given.model = model;
  return defaults_for(given);
}
/// gpt's defaults: AdamW, lr 0.001, weight decay 0.01, batch size 32, 2 epochs of
/// data::text_windows' windows, cosine schedule.
job_spec language_model_defaults();

/// Throws troupe::error when the settings do not combine (troupe::validate) or the model is not in the zoo.
void validate(const job_spec& spec);

// The one table of keys behind the job file, the command line, --dump-config and --help.

/// The type of a key's value: in a job file a TOML boolean, integer, number (an integer or a
/// float), string or array of numbers; on the command line the same as text ("1,1,2,4" for numbers).
enum class value_kind { boolean, integer, number, text, numbers };

/// A value on its way into a job_spec; the alternative's index is its value_kind.
using job_value = std::variant<bool, int64_t, double, std::string, std::vector<double>>;

/// One key: `name = value` in a job file, `--name value` on the command line.
struct job_key {
  std::string name;        ///< the TOML key and the option's name without "--"
  std::string value_name;  ///< the value in the usage text: N, F, NAME, FILE, ...
  std::string help;        ///< one line for --help and the comment in to_job_file
  value_kind kind = value_kind::text;
  std::string expected;    ///< a valid value in words, for errors: "an integer in [1, 1024]"
  /// Stores a value of `kind` in the spec; false (spec unchanged) when it is out of range.
  std::function<bool(job_spec&, const job_value&)> set;
  /// The spec's value of this key.
  std::function<job_value(const job_spec&)> get;
  /// Whether a job reads this key (empty: every job does), and which jobs do, in words
  /// ("--algorithm allreduce", "a job with --push-every > 1"): a value the job does not read is
  /// noted in the log (unread_keys), not an error.
  std::function<bool(const job_spec&)> applies;
  std::string applies_to;
};

/// Every key of the top level (the command line's options), in the order of the usage text and of to_job_file.
const std::vector<job_key>& job_keys();
/// The keys of the [cluster] table besides its `nodes` (job files only).
const std::vector<job_key>& cluster_keys();
/// The key called `name`, or nullptr.
const job_key* find_job_key(const std::string& name);

/// The keys `spec` gives a value other than its defaults' (defaults_for) that its job does not read,
/// each as a note for the log: "--bucket-mb 4.0 has no effect: only --algorithm allreduce reads it".
std::vector<std::string> unread_keys(const job_spec& spec);
/// Throws troupe::error when a value of `s` is outside its key's range (the
/// key table's, the one place each range is written): "--epochs: expected an
/// integer >= 1, got 0". validate(settings) calls it for a job built in code.
void check_ranges(const settings& s);
/// For a key troupe no longer reads ("speeds"), an error saying what replaced it and how to convert
/// `values` (the old key's values, or an example when they are empty or not valid); "" for any other
/// name. `option`: spelt as an option (--speeds 1,1,2,4) rather than as a job-file key.
std::string retired_key(const std::string& name, const std::vector<double>& values, bool option);
/// The key among `names` closest to a misspelt `name`, or "" when none is close.
std::string closest_name(const std::string& name, const std::vector<std::string>& names);

/// Sets `key` from command-line text; throws troupe::error such as
/// "--workers: expected an integer in [1, 1024], got 'eight'".
void set_from_text(job_spec& spec, const job_key& key, const std::string& text);
/// Applies the keys of the job file at `path` to `spec`, checking each value but not how they
/// combine: the command line validates once its own options are applied too.
void apply_job_file(job_spec& spec, const std::string& path);

} // namespace troupe::train
