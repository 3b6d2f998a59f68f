#pragma once

// The trainer's command line: every key of a job file (train/job_file.hpp) is
// an option, `--workers 4` or `--workers=4`, and `--config job.toml` reads a
// job file under them.

#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "train/job_file.hpp"

namespace troupe::train {

/// What the trainer was asked to do.
struct command_line {
  job_spec spec;             ///< the job file (--config), then every option given on top of it
  bool dump_config = false;  ///< --dump-config: print the effective job file and exit
  std::string node;          ///< --node NAME: which node of the job file's cluster this process is
  bool help = false;         ///< --help was given; `text` holds the usage
  bool version = false;      ///< --version was given (and not --help): print "PROGRAM troupe::version()"
  std::string text;          ///< usage text when help
};

/// What a program adds to the trainer's usage text (troupe_plan: its --json).
struct usage_options {
  std::string synopsis = "[--config FILE] [--name VALUE | --name=VALUE]...";  ///< after "usage: PROGRAM "
  std::string about;  ///< what the program does (empty: the trainer's words); wrapped to 80 columns
  std::vector<std::pair<std::string, std::string>> extra_options;  ///< {"--json", "print ..."}, before --help
};

/// Parses argv: `--config FILE` is read first wherever it appears, the options given override it;
/// `--name value` and `--name=value` both work, and the last of a repeated option counts. Throws
/// troupe::error for an unknown option, a missing value or a bad value, naming the option (e.g.
/// "--workers: expected an integer in [1, 1024], got 'eight'"), and then validates like the job file.
command_line parse_command_line(int argc, const char* const* argv, const std::string& program = "troupe_trainer");

/// The usage text, every line at most 80 columns: every key as `--name VALUE  help`, --config,
/// --dump-config, --help and --version, then the keys of a job file's [cluster] table.
std::string usage(const std::string& program = "troupe_trainer", const usage_options& options = {});

/// `text` wrapped at word boundaries to lines of at most `width` columns, each line after the first
/// indented by `indent` spaces (a hanging indent); a word longer than a line stays whole. Newlines in
/// `text` start new lines (indented too).
std::string wrap(const std::string& text, std::size_t indent = 0, std::size_t width = 80);

/// For a program with arguments of its own (the samples): when argv[1] is --help or -h, prints
/// `usage` to `out`; when it is --version, prints "NAME troupe::version()" (NAME: argv[0]'s file
/// name). True when it printed: the program then exits with status 0.
bool help_or_version(int argc, const char* const* argv, const std::string& usage, std::ostream& out);

} // namespace troupe::train
