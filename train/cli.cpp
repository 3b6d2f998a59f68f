#include "train/cli.hpp"

#include <CLI/CLI.hpp>

#include <ostream>
#include <vector>

#include "tensor/error.hpp"

namespace troupe::train {

namespace {

constexpr std::size_t help_column = 28;

// wrap(), the first line starting at `column` (where the caller's text ends).
std::string wrap_from(const std::string& text, std::size_t column, std::size_t indent, std::size_t width) {
  std::string out;
  bool fresh = true;  // no word on this line yet
  for (std::size_t pos = 0; pos < text.size();) {
    if (text[pos] == ' ') {
      ++pos;
      continue;
    }
    if (text[pos] == '\n') {
      out += '\n';
      column = 0;
      fresh = true;
      ++pos;
      continue;
    }
    const std::size_t end = std::min(text.find_first_of(" \n", pos), text.size());
    const std::string word = text.substr(pos, end - pos);
    pos = end;
    if (!fresh && column + 1 + word.size() > width) {
      out += '\n';
      column = 0;
      fresh = true;
    }
    if (column == 0 && !out.empty()) {  // a line after the first
      out += std::string(indent, ' ');
      column = indent;
    }
    if (!fresh) {
      out += ' ';
      ++column;
    }
    out += word;
    column += word.size();
    fresh = false;
  }
  return out;
}

// "  --name VALUE              help", the help wrapped under itself; a long
// left part puts the help on the next line.
std::string usage_line(const std::string& left, const std::string& help) {
  std::string line = "  " + left;
  if (line.size() + 2 > help_column) line += "\n";
  line += std::string(help_column - (line.back() == '\n' ? 0 : line.size()), ' ');
  return line + wrap_from(help, help_column, help_column, 80) + "\n";
}

// The option that `arg` ("--workers", "--workers=4") names, when it is one of ours.
bool is_our_option(const std::string& arg) {
  if (arg == "-h") return true;
  if (arg.rfind("--", 0) != 0) return false;
  const std::string name = arg.substr(2, arg.find('=') == std::string::npos ? std::string::npos : arg.find('=') - 2);
  return name == "config" || name == "dump-config" || name == "node" || name == "help" || name == "version" ||
         find_job_key(name) != nullptr;
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

// The first of CLI11's leftovers, `extra` (an argument and what followed it).
[[noreturn]] void unexpected(const std::vector<std::string>& extra) {
  const std::string& arg = extra.front();
  const std::string option = arg.substr(0, arg.find('='));
  if (option.rfind("--", 0) == 0) {
    const std::string value = arg.find('=') != std::string::npos ? arg.substr(arg.find('=') + 1)
                              : extra.size() > 1                  ? extra[1]
                                                                  : "";
    std::vector<double> values;
    for (std::size_t pos = 0; !value.empty() && pos <= value.size();) {
      const std::size_t comma = std::min(value.find(',', pos), value.size());
      char* end = nullptr;
      const std::string item = value.substr(pos, comma - pos);
      const double x = std::strtod(item.c_str(), &end);
      if (item.empty() || *end != '\0') {
        values.clear();
        break;
      }
      values.push_back(x);
      pos = comma + 1;
    }
    if (std::string retired = retired_key(option.substr(2), values, true); !retired.empty()) throw error(retired);
  }
  const std::size_t name_start = option.find_first_not_of('-');
  if (name_start == 0 || name_start == std::string::npos) {
    const bool toml = arg.size() > 5 && arg.compare(arg.size() - 5, 5, ".toml") == 0;
    const std::string hint = toml              ? "give a job file with --config " + arg
                             : name_start == 0 ? "options start with --; see --help"
                                               : "the trainer takes options only; see --help";
    throw error("unexpected argument '" + arg + "' (" + hint + ")");
  }
  std::vector<std::string> names{"config", "dump-config", "node", "help", "version"};
  for (const job_key& k : job_keys()) names.push_back(k.name);
  const std::string close = closest_name(option.substr(name_start), names);
  throw error("unknown option " + option + (close.empty() ? "" : " (did you mean --" + close + "?)") + "; see --help");
}

// The arguments after the program's name as CLI11's parse(vector) takes them: reversed (it pops from the
// back). CLI11 reads "--name=" as "--name" alone and takes the next word as its value: "" is given explicitly.
std::vector<std::string> cli11_arguments(int argc, const char* const* argv) {
  std::vector<std::string> reversed;
  for (int i = argc - 1; i > 0; --i) {
    const std::string arg = argv[i];
    const bool empty_value = arg.rfind("--", 0) == 0 && arg.find('=') == arg.size() - 1;
    if (empty_value) reversed.emplace_back();
    reversed.push_back(empty_value ? arg.substr(0, arg.size() - 1) : arg);
  }
  return reversed;
}

// app.parse of the command line; its errors as troupe::error, saying what is wrong in our words.
void parse_arguments(CLI::App& app, int argc, const char* const* argv) {
  std::vector<std::string> reversed = cli11_arguments(argc, argv);
  try {
    app.parse(reversed);  // the lvalue overload, as before (the rvalue one parses differently)
  } catch (const CLI::ArgumentMismatch& e) {
    rethrow_mismatch(argc, argv, e);
  } catch (const CLI::ParseError& e) {
    throw error(std::string(e.what()) + " (see --help)");
  }
}

} // namespace

std::string usage(const std::string& program, const usage_options& options) {
  const std::string about =
      !options.about.empty()
          ? options.about
          : "Trains a zoo model on Fashion-MNIST (or other IDX data): in one plain loop (--algorithm sequential), "
            "or on actors: data loaders, workers and parameter shards exchanging Cap'n Proto messages.\n"
            "A job file (TOML) holds the same keys without the dashes, e.g. workers = 4 and worker-speeds = "
            "[4, 4, 2, 1].";
  std::string out = wrap("usage: " + program + " " + options.synopsis, 8 + program.size()) + "\n" + wrap(about) +
                    "\n\noptions:\n";
  out += usage_line("--config FILE", "read the job file FILE first; the options given override its keys");
  for (const job_key& k : job_keys()) out += usage_line("--" + k.name + " " + k.value_name, k.help);
  out += usage_line("--node NAME", "which node of the job file's [cluster] this process is (under srun: Slurm says)");
  out += usage_line("--dump-config", "print the effective job file (--config and the options given) and exit");
  for (const auto& [left, help] : options.extra_options) out += usage_line(left, help);
  out += usage_line("-h, --help", "print this text and exit");
  out += usage_line("--version", "print \"" + program + " VERSION\" and exit");
  out += "\n" + wrap("job file [cluster] table: the nodes of a run on several processes (README, \"A cluster\"); "
                     "job files only, no options:") +
         "\n";
  for (const job_key& k : cluster_keys()) out += usage_line(k.name + " = " + k.value_name, k.help);
  out += usage_line("nodes = [...]",
                    "one table per node: { name = \"a\", host = \"10.0.0.1\", port = 7001 }, and optionally "
                    "workers = BOOL, shards = BOOL (whether it hosts them, default true), threads = N (0: all "
                    "cores), devices = [{ kind = \"cpu\", speed = 1.0, memory-mb = 0 }] (a pipeline's devices)");
  out += "\n" + wrap("exit status: 0 done, 1 an error, 2 a bad command line or job file, 3 the run diverged, 4 a bad "
                     "message, 5 a lost node the run cannot go on without, 6 a timeout (a node that did not join, "
                     "no progress)") +
         "\n";
  return out;
}

std::string wrap(const std::string& text, std::size_t indent, std::size_t width) {
  return wrap_from(text, 0, indent, width);
}

bool help_or_version(int argc, const char* const* argv, const std::string& usage, std::ostream& out) {
  if (argc < 2) return false;
  const std::string arg = argv[1];
  if (arg == "--help" || arg == "-h") {
    out << usage;
    if (!usage.empty() && usage.back() != '\n') out << "\n";
    return true;
  }
  if (arg != "--version") return false;
  std::string name = argv[0];
  if (const std::size_t slash = name.rfind('/'); slash != std::string::npos) name = name.substr(slash + 1);
  out << name << " " << troupe::version() << "\n";
  return true;
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
  app.add_flag("--version", out.version);
  for (std::size_t i = 0; i < keys.size(); ++i)
    options[i] = app.add_option("--" + keys[i].name, raw[i])->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  parse_arguments(app, argc, argv);
  if (out.help) {
    out.text = usage(program);
    out.version = false;
    return out;
  }
  if (out.version) return out;

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
  if (std::vector<std::string> extra = app.remaining(); !extra.empty()) unexpected(extra);

  if (has_config && config.empty()) missing_value("--config", "FILE");
  // The job file, then the options; once more on the model's own defaults when it has some (gpt).
  const auto apply_all = [&](job_spec& spec) {
    if (has_config) apply_job_file(spec, config);
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (options[i]->count() > 0) set_from_text(spec, keys[i], raw[i]);
  };
  apply_all(out.spec);
  if (defaults_for(out.spec).model != job_spec{}.model) {
    out.spec = defaults_for(out.spec);
    apply_all(out.spec);
  }
  try {
    validate(out.spec);
  } catch (const error& e) {
    if (!has_config) throw;
    throw error(config + (any_option ? " + command line: " : ": ") + e.what());
  }
  return out;
}

} // namespace troupe::train
