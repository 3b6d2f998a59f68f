#pragma once

// The trainer's command line: every key of a job file (train/job_file.hpp) is
// an option, `--workers 4` or `--workers=4`, and `--config job.toml` reads a
// job file under them.

#include <string>

#include "train/job_file.hpp"

namespace troupe::train {

/// What the trainer was asked to do.
struct command_line {
  job_spec spec;             ///< the job file (--config), then every option given on top of it
  bool dump_config = false;  ///< --dump-config: print the effective job file and exit
  std::string node;          ///< --node NAME: which node of the job file's cluster this process is
  bool help = false;         ///< --help was given; `text` holds the usage
  std::string text;          ///< usage text when help
};

/// Parses argv: `--config FILE` is read first wherever it appears, the options given override it;
/// `--name value` and `--name=value` both work, and the last of a repeated option counts. Throws
/// troupe::error for an unknown option, a missing value or a bad value, naming the option (e.g.
/// "--workers: expected an integer in [1, 1024], got 'eight'"), and then validates like the job file.
command_line parse_command_line(int argc, const char* const* argv, const std::string& program = "troupe_trainer");

/// The usage text: every key as `--name VALUE  help`, and --config, --dump-config, --help.
std::string usage(const std::string& program = "troupe_trainer");

} // namespace troupe::train
