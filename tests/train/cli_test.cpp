#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tensor/error.hpp"
#include "tests/test_util.hpp"
#include "tests/train/spec_fields.hpp"
#include "train/cli.hpp"

using namespace troupe;
using namespace troupe::train;
using Catch::Matchers::Contains;
using Catch::Matchers::Equals;
using Catch::Matchers::StartsWith;
using testing::differences;
using testing::message;

namespace {

command_line parse(std::vector<std::string> args) {
  args.insert(args.begin(), "troupe_trainer");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  return parse_command_line(static_cast<int>(argv.size()), argv.data());
}

// `text` with every run of spaces and newlines as one space: what wrapping does not change.
std::string unwrapped(const std::string& text) {
  std::string out;
  for (char c : text) {
    const bool blank = c == ' ' || c == '\n';
    if (!blank) out += c;
    else if (!out.empty() && out.back() != ' ') out += ' ';
  }
  return out;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  REQUIRE(f.good());
}

} // namespace

TEST_CASE("no options is the default job", "[cli]") {
  const command_line cl = parse({});
  CHECK(differences(cl.spec, job_spec{}).empty());
  CHECK_FALSE(cl.help);
  CHECK_FALSE(cl.dump_config);
}

TEST_CASE("options take --name=value and --name value alike", "[cli]") {
  const command_line a = parse({"--model=mlp", "--epochs=3", "--lr=0.1", "--algorithm=asgd", "--workers=2",
                                "--worker-speeds=1,2.5", "--checkpoint=a=b.bin"});
  const command_line b = parse({"--model", "mlp", "--epochs", "3", "--lr", "0.1", "--algorithm", "asgd", "--workers",
                                "2", "--worker-speeds", "1,2.5", "--checkpoint", "a=b.bin"});
  CHECK(differences(a.spec, b.spec).empty());
  CHECK(a.spec.model == "mlp");
  CHECK(a.spec.train.epochs == 3);
  CHECK(a.spec.train.lr == 0.1f);
  CHECK(a.spec.train.algo.worker_speeds == std::vector<float>{1.0f, 2.5f});
  CHECK(a.spec.train.checkpoint == "a=b.bin");
}

TEST_CASE("every option name parses and sets its own field", "[cli]") {
  struct option_case {
    std::string name, value, field;
  };
  // On top of --algorithm asgd, a checkpoint and 2 pipeline stages, so that the distributed, checkpoint and
  // placement options validate.
  const std::vector<option_case> cases{
      {"model", "mlp", "model"},
      {"epochs", "2", "epochs"},
      {"batch-size", "32", "batch_size"},
      {"lr", "0.1", "lr"},
      {"momentum", "0.5", "momentum"},
      {"weight-decay", "0.001", "weight_decay"},
      {"optimizer", "adamw", "optimizer"},
      {"gemm", "eigen", "gemm"},
      {"lr-schedule", "constant", "schedule"},
      {"warmup-steps", "30", "warmup_steps"},
      {"accumulate", "4", "accumulate"},
      {"seed", "42", "seed"},
      {"threads", "2", "threads"},
      {"data-dir", "/data/idx", "data_dir"},
      {"context", "64", "context"},
      {"dim", "64", "dim"},
      {"heads", "8", "heads"},
      {"blocks", "2", "blocks"},
      {"mlp-ratio", "2", "mlp_ratio"},
      {"checkpoint", "ck.bin", "checkpoint"},
      {"checkpoint-every-steps", "50", "checkpoint_every_steps"},
      {"checkpoint-every-seconds", "2.5", "checkpoint_every_s"},
      {"metrics-out", "run.jsonl", "metrics_out"},
      {"max-steps", "100", "max_steps"},
      {"sample-tokens", "40", "sample_tokens"},
      {"validation-fraction", "0.25", "validation_fraction"},
      {"evaluate", "false", "evaluate"},
      {"progress", "none", "progress"},
      {"algorithm", "ddc-asgd", "algorithm"},
      {"workers", "3", "workers"},
      {"shards", "2", "shards"},
      {"shard-cut", "even", "shard_cut"},
      {"push-every", "4", "push_every"},
      {"worker-lr", "0.05", "worker_lr"},
      {"worker-momentum", "0.5", "worker_momentum"},
      {"worker-speeds", "2", "worker_speeds"},
      {"prefetch", "4", "prefetch"},
      {"overlap", "false", "overlap"},
      {"overlap-receive", "false", "overlap_receive"},
      {"dc-lambda", "0.1", "lambda"},
      {"dc-lambda0", "1.5", "lambda0"},
      {"dc-rho-ms", "0.5", "rho_ms"},
      {"ddc-alpha", "0.4", "alpha"},
      {"ddc-mu0", "0.5", "mu0"},
      {"ddc-version", "2", "ddc_version"},
      {"ddc-tau-decay", "0.9", "tau_decay"},
      {"bucket-mb", "4", "bucket_mb"},
      {"clip-grad-norm", "2", "clip_grad_norm"},
      {"allreduce-dtype", "bf16", "allreduce_dtype"},
      {"pipeline-stages", "3", "pipeline_stages"},
      {"micro-batches", "2", "micro_batches"},
      {"schedule", "1f1b", "pipeline_schedule"},
      {"pipeline-cuts", "3", "pipeline_cuts"},
      {"stash", "2", "stash"},
      {"placement", "greedy", "placement"},
      {"device-speeds", "1,2", "device_speeds"},
      {"device-memory", "100,0", "device_memory_mb"},
      {"stage-devices", "1,0", "stage_devices"},
      {"link-cost", "1e-9,3e-5", "link_cost"},
      {"profile-cache", "costs.txt", "profile_cache"},
      {"trace", "t.json", "trace"},
  };
  CHECK(cases.size() == job_keys().size());
  const job_spec base = parse({"--algorithm", "asgd", "--checkpoint", "base.ckpt", "--pipeline-stages", "2"}).spec;
  for (const option_case& c : cases) {
    INFO("--" << c.name << " " << c.value);
    const command_line cl =
        parse({"--algorithm", "asgd", "--checkpoint", "base.ckpt", "--pipeline-stages", "2", "--" + c.name, c.value});
    const std::vector<std::string> changed = differences(cl.spec, base);
    REQUIRE(changed.size() == 1);
    CHECK_THAT(changed[0], StartsWith(c.field + ": "));
  }
}

TEST_CASE("a --config file is read first wherever it appears, the options override it", "[cli]") {
  testing::temp_dir dir;
  const std::string path = dir.file("job.toml");
  write_file(path, "algorithm = \"asgd\"\nworkers = 4\nepochs = 7\nmodel = \"mlp\"\n");
  for (const auto& args : {std::vector<std::string>{"--workers", "2", "--config", path},
                           std::vector<std::string>{"--config=" + path, "--workers=2"}}) {
    const command_line cl = parse(args);
    CHECK(cl.spec.train.algo.kind == algorithm_kind::asgd);
    CHECK(cl.spec.train.algo.workers == 2);
    CHECK(cl.spec.train.epochs == 7);
    CHECK(cl.spec.model == "mlp");
    CHECK(cl.spec.train.batch_size == 64);
  }
}

TEST_CASE("a repeated option takes its last value", "[cli]") {
  CHECK(parse({"--epochs", "2", "--epochs=3"}).spec.train.epochs == 3);
}

TEST_CASE("an unknown option is named, with a suggestion when one is close", "[cli]") {
  CHECK_THROWS_MATCHES(parse({"--wokers", "4"}), error,
                       message(Equals("unknown option --wokers (did you mean --workers?); see --help")));
  CHECK_THROWS_MATCHES(parse({"--batch_size=4"}), error,
                       message(Equals("unknown option --batch_size (did you mean --batch-size?); see --help")));
  CHECK_THROWS_MATCHES(parse({"--colour", "blue"}), error, message(Equals("unknown option --colour; see --help")));
  CHECK_THROWS_MATCHES(parse({"-x"}), error, message(StartsWith("unknown option -x")));
  CHECK_THROWS_MATCHES(parse({"job.toml"}), error,
                       message(Equals("unexpected argument 'job.toml' (give a job file with --config job.toml)")));
  CHECK_THROWS_MATCHES(parse({"--epochs", "2", "3"}), error,
                       message(Equals("unexpected argument '3' (options start with --; see --help)")));
  CHECK_THROWS_MATCHES(parse({"--", "--epochs", "3"}), error, message(StartsWith("unexpected argument '")));
}

TEST_CASE("a missing value names the option", "[cli]") {
  CHECK_THROWS_MATCHES(parse({"--epochs", "2", "--workers"}), error, message(Equals("--workers needs a value (N)")));
  CHECK_THROWS_MATCHES(parse({"--workers", "--epochs", "3"}), error, message(Equals("--workers needs a value (N)")));
  CHECK_THROWS_MATCHES(parse({"--config"}), error, message(Equals("--config needs a value (FILE)")));
  CHECK_THROWS_MATCHES(parse({"--config="}), error, message(Equals("--config needs a value (FILE)")));
}

TEST_CASE("a bad value names the option, what it expects and what it got", "[cli]") {
  CHECK_THROWS_MATCHES(parse({"--workers", "eight"}), error,
                       message(Equals("--workers: expected an integer in [1, 1024], got 'eight'")));
  CHECK_THROWS_MATCHES(parse({"--epochs=-1"}), error, message(Equals("--epochs: expected an integer >= 1, got '-1'")));
  CHECK_THROWS_MATCHES(parse({"--weight-decay", "-1"}), error,
                       message(Equals("--weight-decay: expected a number >= 0, got '-1'")));
  CHECK_THROWS_MATCHES(parse({"--lr", "0.1x"}), error, message(Equals("--lr: expected a number > 0, got '0.1x'")));
  CHECK_THROWS_MATCHES(parse({"--epochs", "2.5"}), error, message(StartsWith("--epochs: expected an integer")));
  CHECK_THROWS_MATCHES(parse({"--epochs="}), error, message(Equals("--epochs: expected an integer >= 1, got ''")));
  CHECK_THROWS_MATCHES(parse({"--worker-speeds", "1,,2"}), error,
                       message(Equals("--worker-speeds: expected a list of numbers > 0, got '1,,2'")));
  CHECK_THROWS_MATCHES(parse({"--evaluate", "maybe"}), error,
                       message(Equals("--evaluate: expected true or false, got 'maybe'")));
  CHECK_THROWS_MATCHES(parse({"--algorithm", "fast"}), error, message(StartsWith("--algorithm: expected one of sequential")));
}

TEST_CASE("booleans and lists have a command-line spelling", "[cli]") {
  CHECK_FALSE(parse({"--evaluate", "false"}).spec.train.evaluate);
  CHECK_FALSE(parse({"--evaluate=no"}).spec.train.evaluate);
  CHECK(parse({"--evaluate=true"}).spec.train.evaluate);
  CHECK(parse({"--algorithm=asgd", "--workers=4", "--worker-speeds", "4, 4, 2, 1"}).spec.train.algo.worker_speeds ==
        std::vector<float>{4, 4, 2, 1});
  CHECK(parse({"--worker-speeds="}).spec.train.algo.worker_speeds.empty());
}

TEST_CASE("the command line validates like the job file", "[cli]") {
  CHECK_THROWS_MATCHES(parse({"--model=vgg"}), error,
                       message(Equals("unknown model 'vgg' (choose mlp, cnn, resnet or gpt)")));
  CHECK_THROWS_MATCHES(parse({"--workers", "2"}), error,
                       message(StartsWith("--workers, --shards, --push-every and --worker-speeds need an asynchronous")));
  testing::temp_dir dir;
  const std::string path = dir.file("job.toml");
  write_file(path, "algorithm = \"asgd\"\nworkers = 2\nworker-speeds = [2, 1]\n");
  CHECK_THROWS_MATCHES(parse({"--config", path, "--workers", "3"}), error,
                       message(Equals(path + " + command line: --worker-speeds: 2 speeds for 3 workers (give one per "
                                             "worker, larger is faster, e.g. 4,4,2,1)")));
  write_file(path, "algorithm = \"asgd\"\nworkers = 2\nworker-speeds = [3, 2, 1]\n");
  CHECK_THROWS_MATCHES(parse({"--config", path}), error, message(StartsWith(path + ": --worker-speeds: 3 speeds")));
  CHECK(parse({"--config", path, "--workers", "3"}).spec.train.algo.workers == 3);
  write_file(path, "wokers = 2\n");
  CHECK_THROWS_MATCHES(parse({"--config", path}), error, message(StartsWith(path + ":1: unknown key 'wokers'")));
  CHECK_THROWS_MATCHES(parse({"--config", dir.file("nope.toml")}), error,
                       message(Equals("job file " + dir.file("nope.toml") + " does not exist")));
}

TEST_CASE("the usage of --help lists every key", "[cli]") {
  for (const auto& args : {std::vector<std::string>{"--help"}, std::vector<std::string>{"-h"},
                           std::vector<std::string>{"--epochs", "0", "--help"}}) {
    const command_line cl = parse(args);
    REQUIRE(cl.help);
    CHECK(cl.text == usage());
  }
  const std::string text = unwrapped(usage());
  for (const job_key& k : job_keys()) {
    INFO(k.name);
    CHECK_THAT(text, Contains(" --" + k.name + " " + k.value_name + " " + unwrapped(k.help) + " "));
  }
  CHECK_THAT(text, Contains(" --config FILE "));
  CHECK_THAT(text, Contains(" --dump-config "));
  CHECK_THAT(text, Contains(" -h, --help print this text and exit "));
  CHECK_THAT(text, Contains(" --version print \"troupe_trainer VERSION\" and exit "));
  CHECK_THAT(text, Contains("A job file (TOML) holds the same keys"));
  CHECK_THAT(usage("my_trainer"), StartsWith("usage: my_trainer "));
}

TEST_CASE("the --dump-config flag is set, and its job file reads back to the same job", "[cli]") {
  const command_line cl = parse({"--dump-config", "--algorithm", "ddc-asgd", "--workers", "4", "--worker-speeds", "4,4,2,1",
                                 "--lr", "0.03"});
  CHECK(cl.dump_config);
  CHECK_FALSE(cl.help);
  CHECK(differences(parse_job_file(to_job_file(cl.spec), "dump.toml"), cl.spec).empty());
  CHECK_FALSE(parse({"--epochs", "2"}).dump_config);
}

TEST_CASE("the usage fits a terminal: every line at most 80 columns", "[cli]") {
  for (const std::string& text :
       {usage(), usage("troupe_plan", usage_options{"[--config FILE] [--name VALUE]... [--json]", "Prints a plan.",
                                                    {{"--json", "print the plan as one JSON object"}}})}) {
    const std::vector<std::string> lines = lines_of(text);
    REQUIRE(lines.size() > 20);
    for (const std::string& line : lines) {
      INFO(line);
      CHECK(line.size() <= 80);
      CHECK((line.empty() || line.back() != ' '));
    }
  }
  // A help wrapped under itself: the lines after the first start in the help column.
  const std::vector<std::string> lines = lines_of(usage());
  bool continued = false;
  for (std::size_t i = 1; i < lines.size(); ++i)
    if (lines[i - 1].rfind("  --overlap-receive BOOL", 0) == 0) {
      CHECK(lines[i].rfind(std::string(28, ' '), 0) == 0);
      CHECK(lines[i][28] != ' ');
      continued = true;
    }
  CHECK(continued);
}

TEST_CASE("wrap breaks at spaces with a hanging indent", "[cli]") {
  CHECK(wrap("one two three four", 4, 10) == "one two\n    three\n    four");
  CHECK(wrap("a\nb c", 2, 80) == "a\n  b c");
  CHECK(wrap("unbreakable-word-longer-than-the-line x", 2, 10) == "unbreakable-word-longer-than-the-line\n  x");
  CHECK(wrap("", 2, 10).empty());
}

TEST_CASE("the usage lists the job file's [cluster] keys", "[cli]") {
  const std::string text = unwrapped(usage());
  CHECK_THAT(text, Contains("[cluster]"));
  REQUIRE_FALSE(cluster_keys().empty());
  for (const job_key& k : cluster_keys()) {
    INFO(k.name);
    CHECK_THAT(text, Contains(" " + k.name + " = " + k.value_name + " " + unwrapped(k.help) + " "));
  }
  CHECK_THAT(text, Contains(" nodes = [...] one table per node: { name = "));
}

TEST_CASE("cli: --version is a flag, --help wins over it", "[cli]") {
  CHECK(parse({"--version"}).version);
  CHECK(parse({"--epochs", "0", "--version"}).version);  // nothing validated: the version only
  CHECK_FALSE(parse({"--epochs", "2"}).version);
  const command_line both = parse({"--version", "--help"});
  CHECK(both.help);
  CHECK_FALSE(both.version);
  CHECK_THAT(std::string(troupe::version()), Catch::Matchers::Matches("[0-9]+\\.[0-9]+\\.[0-9]+"));
}

TEST_CASE("a program's own arguments: help_or_version answers --help, -h and --version only", "[cli]") {
  const char* help[] = {"/usr/bin/my_tool", "--help"};
  const char* h[] = {"my_tool", "-h"};
  const char* version[] = {"/opt/x/bin/my_tool", "--version"};
  const char* other[] = {"my_tool", "run.ckpt"};
  const char* none[] = {"my_tool"};
  std::ostringstream out;
  CHECK(help_or_version(2, help, "usage: my_tool FILE\n", out));
  CHECK(out.str() == "usage: my_tool FILE\n");
  out.str("");
  CHECK(help_or_version(2, h, "usage: my_tool FILE", out));
  CHECK(out.str() == "usage: my_tool FILE\n");
  out.str("");
  CHECK(help_or_version(2, version, "usage", out));
  CHECK(out.str() == std::string("my_tool ") + troupe::version() + "\n");
  out.str("");
  CHECK_FALSE(help_or_version(2, other, "usage", out));
  CHECK_FALSE(help_or_version(1, none, "usage", out));
  CHECK(out.str().empty());
}

TEST_CASE("the old --speeds is refused, saying what replaced it and how to convert", "[cli]") {
  const std::string what = "--speeds was replaced by --worker-speeds, where larger is faster as in --device-speeds: ";
  CHECK_THROWS_MATCHES(parse({"--algorithm", "asgd", "--workers", "4", "--speeds", "1,1,2,4"}), error,
                       message(Equals(what + "--speeds 1,1,2,4 is --worker-speeds 4,4,2,1 (each worker's speed is the "
                                             "largest slowdown over its own)")));
  CHECK_THROWS_MATCHES(parse({"--speeds=1,1.5"}), error,
                       message(StartsWith(what + "--speeds 1,1.5 is --worker-speeds 1.5,1 ")));
  CHECK_THROWS_MATCHES(parse({"--speeds"}), error, message(StartsWith(what + "--speeds 1,1,2,4 is --worker-speeds 4,4,2,1")));
}

TEST_CASE("cli: --worker-speeds gives the slowdowns --speeds gave", "[cli]") {
  // --speeds 1,1,2,4 slowed the third worker 2x and the fourth 4x: --worker-speeds 4,4,2,1 does the same.
  const command_line cl = parse({"--model", "mlp", "--algorithm", "asgd", "--workers", "4", "--worker-speeds", "4,4,2,1"});
  CHECK(worker_slowdowns(make_job(cl.spec).config().algo) == std::vector<float>{1, 1, 2, 4});
}
