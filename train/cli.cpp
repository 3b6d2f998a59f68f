#include "train/cli.hpp"

#include <CLI/CLI.hpp>

#include <vector>

#include "tensor/error.hpp"

namespace troupe::train {

namespace {

std::string usage_line(const std::string& left, const std::string& help) {
  std::string line = "  " + left;
  line.resize(std::max<std::size_t>(line.size() + 2, 28), ' ');
  return line + help + "\n";
}

// The option that `arg` ("--workers", "--workers=4") names, when it is one of ours.
bool is_our_option(const std::string& arg) {
  if (arg == "-h") return true;
  if (arg.rfind("--", 0) != 0) return false;
  const std::string name = arg.substr(2, arg.find('=') == std::string::npos ? std::string::npos : arg.find('=') - 2);
  return name == "config" || name == "dump-config" || name == "node" || name == "help" || find_job_key(name) != nullptr;
}

[[noreturn]] void missing_value(const std::string& option, const std::string& value_name) {
  throw error(option + " needs a value (" + value_name + ")");
}

// CLI11 takes the word after `--name` as its value even when it is the next option.
void check_value(const std::string& option, const std::string& value_name, const std::string& value) {
  if (is_our_option(value)) missing_value(option, value_name);
}

// CLI11 stops with a cryptic message when the last word is an option without its value.
[[noreturn]] void rethrow_mismatch(int argc, const char* const* argv, const CLI::ParseError& e) {
  const std::string last = argc > 1 ? argv[argc - 1] : "";
  if (last == "--config") missing_value(last, "FILE");
  if (last == "--node") missing_value(last, "NAME");
  if (last.rfind("--", 0) == 0)
    if (const job_key* k = find_job_key(last.substr(2))) missing_value(last, k->value_name);
  throw error(std::string(e.what()) + " (see --help)");
}

[[noreturn]] void unexpected(const std::string& arg) {
  const std::string option = arg.substr(0, arg.find('='));
  const std::size_t name_start = option.find_first_not_of('-');
  if (name_start == 0 || name_start == std::string::npos) {
    const bool toml = arg.size() > 5 && arg.compare(arg.size() - 5, 5, ".toml") == 0;
    const std::string hint = toml              ? "give a job file with --config " + arg
                             : name_start == 0 ? "options start with --; see --help"
                                               : "the trainer takes options only; see --help";
    throw error("unexpected argument '" + arg + "' (" + hint + ")");
  }
  std::vector<std::string> names{"config", "dump-config", "node", "help"};
  for (const job_key& k : job_keys()) names.push_back(k.name);
  const std::string close = closest_name(option.substr(name_start), names);
  throw error("unknown option " + option + (close.empty() ? "" : " (did you mean --" + close + "?)") + "; see --help");
}

} // namespace

std::string usage(const std::string& program) {
  std::string out = "usage: " + program +
                    " [--config FILE] [--name VALUE | --name=VALUE]...\n"
                    "Trains a zoo model on Fashion-MNIST (or other IDX data): in one plain loop (--algorithm "
                    "sequential),\nor on actors: data loaders, workers and parameter shards exchanging Cap'n Proto "
                    "messages.\nA job file (TOML) holds the same keys without the dashes, e.g. workers = 4 and "
                    "speeds = [1, 1, 2, 4].\n\noptions:\n";
  out += usage_line("--config FILE", "read the job file FILE first; the options given override its keys");
  for (const job_key& k : job_keys()) out += usage_line("--" + k.name + " " + k.value_name, k.help);
  out += usage_line("--node NAME", "which node of the job file's [cluster] this process is (under srun: Slurm says)");
  out += usage_line("--dump-config", "print the effective job file (--config and the options given) and exit");
  out += usage_line("-h, --help", "this text");
  return out;
}

command_line parse_command_line(int argc, const char* const* argv, const std::string& program) {
  const std::vector<job_key>& keys = job_keys();
  command_line out;
  std::string config;
  std::vector<std::string> raw(keys.size());
  std::vector<CLI::Option*> options(keys.size());

  CLI::App app("", program);
  app.set_help_flag();
  app.allow_extras();
  CLI::Option* config_option =
      app.add_option("--config", config)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_flag("--dump-config", out.dump_config);
  CLI::Option* node_option = app.add_option("--node", out.node)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_flag("-h,--help", out.help);
  for (std::size_t i = 0; i < keys.size(); ++i)
    options[i] = app.add_option("--" + keys[i].name, raw[i])->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  // CLI11 reads "--name=" as "--name" alone and takes the next word as its value: give "" explicitly.
  std::vector<std::string> reversed;  // CLI11's parse(vector) pops from the back
  for (int i = argc - 1; i > 0; --i) {
    const std::string arg = argv[i];
    const bool empty_value = arg.rfind("--", 0) == 0 && arg.find('=') == arg.size() - 1;
    if (empty_value) reversed.emplace_back();
    reversed.push_back(empty_value ? arg.substr(0, arg.size() - 1) : arg);
  }
  try {
    app.parse(reversed);
  } catch (const CLI::ArgumentMismatch& e) {
    rethrow_mismatch(argc, argv, e);
  } catch (const CLI::ParseError& e) {
    throw error(std::string(e.what()) + " (see --help)");
  }
  if (out.help) {
    out.text = usage(program);
    return out;
  }

  const bool has_config = config_option->count() > 0;
  if (has_config) check_value("--config", "FILE", config);
  if (node_option->count() > 0) {
    check_value("--node", "NAME", out.node);
    if (out.node.empty()) missing_value("--node", "NAME");
  }
  bool any_option = false;
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (options[i]->count() > 0) {
      check_value("--" + keys[i].name, keys[i].value_name, raw[i]);
      any_option = true;
    }
  if (std::vector<std::string> extra = app.remaining(); !extra.empty()) unexpected(extra.front());

  if (has_config) {
    if (config.empty()) missing_value("--config", "FILE");
    apply_job_file(out.spec, config);
  }
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (options[i]->count() > 0) set_from_text(out.spec, keys[i], raw[i]);
  try {
    validate(out.spec);
  } catch (const error& e) {
    if (!has_config) throw;
    throw error(config + (any_option ? " + command line: " : ": ") + e.what());
  }
  return out;
}

} // namespace troupe::train
