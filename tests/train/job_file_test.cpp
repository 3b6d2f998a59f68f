#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include "model/zoo.hpp"
#include "tensor/error.hpp"
#include "tests/test_util.hpp"
#include "tests/train/spec_fields.hpp"
#include "train/job_file.hpp"

using namespace troupe;
using namespace troupe::train;
using Catch::Matchers::Contains;
using Catch::Matchers::Equals;
using Catch::Matchers::Matches;
using Catch::Matchers::StartsWith;
using testing::differences;
using testing::message;

namespace {

job_spec parse(const std::string& text, job_spec base = {}) { return parse_job_file(text, "job.toml", base); }

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  REQUIRE(f.good());
}

} // namespace

TEST_CASE("the defaults round-trip through to_job_file", "[job_file]") {
  const job_spec defaults;
  const job_spec back = parse(to_job_file(defaults));
  CHECK(differences(back, defaults).empty());
}

TEST_CASE("a spec with every field changed round-trips through to_job_file", "[job_file]") {
  const job_spec changed = testing::everything_changed();
  CHECK(differences(changed, job_spec{}).size() == testing::fields(changed).size());
  const std::string text = to_job_file(changed);
  INFO(text);
  CHECK(differences(parse(text), changed).empty());
}

TEST_CASE("floats read back to the same float, whatever their digits", "[job_file]") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int i = 0; i < 300; ++i) {
    job_spec s;
    s.train.momentum = unit(rng);
    uint32_t bits = rng() & 0x7f7fffffu;  // a positive finite float of any magnitude
    std::memcpy(&s.train.lr, &bits, sizeof bits);
    if (!(s.train.lr > 0.0f)) s.train.lr = 1e-30f;
    const std::string text = to_job_file(s);
    INFO(text);
    const job_spec back = parse(text);
    REQUIRE(back.train.momentum == s.train.momentum);
    REQUIRE(back.train.lr == s.train.lr);
  }
}

TEST_CASE("to_job_file writes every key with a one-line comment", "[job_file]") {
  const std::string text = to_job_file(job_spec{});
  for (const job_key& k : job_keys()) {
    INFO(k.name);
    const auto line_start = text.find("\n" + k.name + " = ");
    REQUIRE(line_start != std::string::npos);
    const std::string line = text.substr(line_start + 1, text.find('\n', line_start + 1) - line_start - 1);
    CHECK_THAT(line, Contains("# " + k.help));
  }
  CHECK_THAT(text, Contains("worker-speeds = []"));
  CHECK_THAT(text, Contains("lr = 0.02 "));
  CHECK_THAT(text, Contains("epochs = 5 "));
  CHECK_THAT(text, Contains("algorithm = \"sequential\""));
}

TEST_CASE("a seed TOML cannot hold is an error, not a wrong file", "[job_file]") {
  job_spec s;
  s.train.seed = UINT64_MAX;
  CHECK_THROWS_MATCHES(to_job_file(s), error, message(Contains("seed = 18446744073709551615 does not fit")));
}

TEST_CASE("a job file sets the keys it holds and keeps base's values for the others", "[job_file]") {
  job_spec base;
  base.train.epochs = 9;
  base.train.lr = 0.5f;
  base.data_dir = "/somewhere";
  const job_spec s = parse(
      "# a job\n"
      "model = \"mlp\"\n"
      "algorithm = \"asgd\"\n"
      "workers = 4\n"
      "batch-size = 32\n"
      "momentum = 0     # an integer where a float goes\n"
      "worker-speeds = [1, 1.5, 2, 4]\n"
      "evaluate = false\n"
      "lr-schedule = \"constant\"\n",
      base);
  CHECK(s.model == "mlp");
  CHECK(s.train.algo.kind == algorithm_kind::asgd);
  CHECK(s.train.algo.workers == 4);
  CHECK(s.train.batch_size == 32);
  CHECK(s.train.momentum == 0.0f);
  CHECK(s.train.algo.worker_speeds == std::vector<float>{1.0f, 1.5f, 2.0f, 4.0f});
  CHECK_FALSE(s.train.evaluate);
  CHECK(s.train.schedule == model::lr_schedule::constant);
  CHECK(s.train.epochs == 9);
  CHECK(s.train.lr == 0.5f);
  CHECK(s.data_dir == "/somewhere");
  CHECK(s.train.algo.shards == 1);
}

TEST_CASE("an empty job file is the base", "[job_file]") {
  job_spec base = testing::everything_changed();
  CHECK(differences(parse("", base), base).empty());
}

TEST_CASE("a value of the wrong type names file, line, key, what was expected and what was given", "[job_file]") {
  CHECK_THROWS_MATCHES(parse("epochs = 3\n\nworkers = \"eight\"\n"), error,
                       message(Equals("job.toml:3: workers: expected an integer in [1, 1024], got \"eight\"")));
  CHECK_THROWS_MATCHES(parse("epochs = 2.5\n"), error,
                       message(Equals("job.toml:1: epochs: expected an integer >= 1, got 2.5")));
  CHECK_THROWS_MATCHES(parse("lr = \"fast\"\n"), error, message(Equals("job.toml:1: lr: expected a number > 0, got \"fast\"")));
  CHECK_THROWS_MATCHES(parse("evaluate = 1\n"), error,
                       message(Equals("job.toml:1: evaluate: expected true or false, got 1")));
  CHECK_THROWS_MATCHES(parse("model = 3\n"), error, message(Equals("job.toml:1: model: expected a string, got 3")));
  CHECK_THROWS_MATCHES(parse("worker-speeds = \"1,2\"\n"), error,
                       message(Equals("job.toml:1: worker-speeds: expected a list of numbers > 0, got \"1,2\"")));
  CHECK_THROWS_MATCHES(parse("worker-speeds = [1, \"x\"]\n"), error,
                       message(Equals("job.toml:1: worker-speeds: expected a list of numbers > 0, got [1, \"x\"]")));
  CHECK_THROWS_MATCHES(parse("epochs = [1]\n"), error,
                       message(Equals("job.toml:1: epochs: expected an integer >= 1, got [1]")));
}

TEST_CASE("a value out of range names file, line and key", "[job_file]") {
  CHECK_THROWS_MATCHES(parse("model = \"mlp\"\nepochs = 0\n"), error,
                       message(Equals("job.toml:2: epochs: expected an integer >= 1, got 0")));
  CHECK_THROWS_MATCHES(parse("workers = 2000\n"), error,
                       message(Equals("job.toml:1: workers: expected an integer in [1, 1024], got 2000")));
  CHECK_THROWS_MATCHES(parse("momentum = 1.0\n"), error,
                       message(Equals("job.toml:1: momentum: expected a number in [0, 1), got 1.0")));
  CHECK_THROWS_MATCHES(parse("weight-decay = -0.1\n"), error,
                       message(Equals("job.toml:1: weight-decay: expected a number >= 0, got -0.1")));
  CHECK_THROWS_MATCHES(parse("lr = 1e300\n"), error,
                       message(Equals("job.toml:1: lr: expected a number > 0, got 1e+300")));
  CHECK_THROWS_MATCHES(parse("worker-speeds = [1, 0]\n"), error,
                       message(Equals("job.toml:1: worker-speeds: expected a list of numbers > 0, got [1, 0]")));
  CHECK_THROWS_MATCHES(parse("threads = 3000000000\n"), error, message(StartsWith("job.toml:1: threads: expected")));
  CHECK_THROWS_MATCHES(parse("seed = -1\n"), error,
                       message(Equals("job.toml:1: seed: expected an integer >= 0, got -1")));
}

TEST_CASE("an enum takes the names its parse function knows", "[job_file]") {
  CHECK(parse("algorithm = \"ddc-asgd\"\n").train.algo.kind == algorithm_kind::ddc_asgd);
  CHECK(parse("progress = \"none\"\n").train.progress == progress_mode::none);
  CHECK_THROWS_MATCHES(parse("algorithm = \"fast\"\n"), error,
                       message(Equals("job.toml:1: algorithm: expected one of sequential, ssgd, asgd, sa-asgd, "
                                      "hogwild, dc-asgd-c, dc-asgd-a, ddc-asgd or allreduce, got \"fast\"")));
  CHECK_THROWS_MATCHES(parse("lr-schedule = \"linear\"\n"), error,
                       message(Equals("job.toml:1: lr-schedule: expected one of constant or cosine, got \"linear\"")));
  CHECK_THROWS_MATCHES(parse("progress = \"auto \"\n"), error,
                       message(Contains("progress: expected one of auto, bar, lines or none")));
}

TEST_CASE("an unknown key names file and line, with a suggestion when one is close", "[job_file]") {
  CHECK_THROWS_MATCHES(parse("epochs = 2\n\nwokers = 4\n"), error,
                       message(Equals("job.toml:3: unknown key 'wokers' (did you mean 'workers'?)")));
  CHECK_THROWS_MATCHES(parse("batch_size = 4\n"), error,
                       message(Equals("job.toml:1: unknown key 'batch_size' (did you mean 'batch-size'?)")));
  CHECK_THROWS_MATCHES(parse("colour = \"blue\"\n"), error, message(Equals("job.toml:1: unknown key 'colour'")));
  CHECK_THROWS_MATCHES(parse("epochs = 2\n[trainer]\nworkers = 4\n"), error,
                       message(Equals("job.toml:2: unknown table 'trainer'")));
}

TEST_CASE("a TOML syntax error names file, line and column", "[job_file]") {
  CHECK_THROWS_MATCHES(parse("epochs = 2\nworkers 4\n"), error, message(StartsWith("job.toml:2:9: not valid TOML: ")));
  CHECK_THROWS_MATCHES(parse("epochs = 2\nepochs = 3\n"), error,
                       message(Matches("job\\.toml:2:[0-9]+: not valid TOML: .*redefine.*'epochs'.*")));
  CHECK_THROWS_MATCHES(parse("lr = 0.1\nmodel = \"mlp\n"), error, message(StartsWith("job.toml:2:")));
}

TEST_CASE("a missing or unreadable job file is named", "[job_file]") {
  testing::temp_dir dir;
  const std::string missing = dir.file("nope.toml");
  CHECK_THROWS_MATCHES(read_job_file(missing), error, message(Equals("job file " + missing + " does not exist")));
  CHECK_THROWS_MATCHES(read_job_file(dir.path()), error,
                       message(Equals("job file " + dir.path() + " is a directory, not a TOML file")));
  CHECK_THROWS_MATCHES(read_job_file(""), error, message(Contains("no job file given")));
}

TEST_CASE("read_job_file reads a file and names it in errors", "[job_file]") {
  testing::temp_dir dir;
  const std::string path = dir.file("job.toml");
  write_file(path, "algorithm = \"asgd\"\nworkers = 2\n");
  const job_spec s = read_job_file(path);
  CHECK(s.train.algo.kind == algorithm_kind::asgd);
  CHECK(s.train.algo.workers == 2);
  write_file(path, "epochs = 1\nepochs = 2\n");
  CHECK_THROWS_MATCHES(read_job_file(path), error, message(StartsWith(path + ":2:")));
  write_file(path, "workers = 0\n");
  CHECK_THROWS_MATCHES(read_job_file(path), error, message(StartsWith(path + ":1: workers: ")));
}

TEST_CASE("settings that do not combine are named after the file", "[job_file]") {
  CHECK_THROWS_MATCHES(parse("algorithm = \"asgd\"\nworkers = 2\nworker-speeds = [4, 2, 1]\n"), error,
                       message(Equals("job.toml: --worker-speeds: 3 speeds for 2 workers (give one per worker, larger "
                                      "is faster, e.g. 4,4,2,1)")));
  CHECK_THROWS_MATCHES(parse("workers = 2\n"), error,
                       message(StartsWith("job.toml: --workers, --shards, --push-every and --worker-speeds need an "
                                          "asynchronous --algorithm")));
}

TEST_CASE("the old speeds key is refused, saying what replaced it and how to convert", "[job_file]") {
  CHECK_THROWS_MATCHES(parse("algorithm = \"asgd\"\nworkers = 4\nspeeds = [1, 1, 2, 4]\n"), error,
                       message(Equals("job.toml:3: speeds was replaced by worker-speeds, where larger is faster as in "
                                      "device-speeds: speeds = [1, 1, 2, 4] is worker-speeds = [4, 4, 2, 1] (each "
                                      "worker's speed is the largest slowdown over its own)")));
  // Values that were never valid slowdowns: the example instead.
  CHECK_THROWS_MATCHES(parse("speeds = \"fast\"\n"), error,
                       message(StartsWith("job.toml:1: speeds was replaced by worker-speeds, where larger is faster as "
                                          "in device-speeds: speeds = [1, 1, 2, 4] is worker-speeds = [4, 4, 2, 1]")));
}

TEST_CASE("worker-speeds reach the slowdowns the old speeds gave", "[job_file]") {
  // speeds = [1, 1, 2, 4] slowed the last two workers 2x and 4x; worker-speeds = [4, 4, 2, 1] does the same.
  const job_spec s = parse("model = \"mlp\"\nalgorithm = \"asgd\"\nworkers = 4\nworker-speeds = [4, 4, 2, 1]\n");
  CHECK(worker_slowdowns(s.train.algo) == std::vector<float>{1, 1, 2, 4});
  CHECK(worker_slowdowns(make_job(s).config().algo) == std::vector<float>{1, 1, 2, 4});
  // Only the ratios count: 3, 1.5 slows the second worker 2x; none given, none slowed.
  CHECK(worker_slowdowns(troupe::asgd().workers(2).worker_speeds({3, 1.5f}).settings()) == std::vector<float>{1, 2});
  CHECK(worker_slowdowns(troupe::asgd().workers(2).settings()).empty());
  CHECK(worker_slowdowns(troupe::job().algorithm(troupe::asgd().workers(2).worker_speeds({1, 4})).config().algo) ==
        std::vector<float>{4, 1});
}

TEST_CASE("an unknown zoo model is named after the file, with the choices", "[job_file]") {
  CHECK_THROWS_MATCHES(parse("model = \"vgg\"\n"), error,
                       message(Equals("job.toml: unknown model 'vgg' (choose mlp, cnn, resnet or gpt)")));
}

TEST_CASE("the key table has one key per option name, each documented", "[job_file]") {
  const std::vector<std::string> names{
      "model",      "epochs",      "batch-size", "lr",        "momentum", "clip-grad-norm",        "weight-decay", "optimizer", "gemm", "lr-schedule", "warmup-steps",
      "accumulate", "seed",       "threads",     "data-dir",   "context",    "dim", "heads", "blocks", "mlp-ratio", "checkpoint", "checkpoint-every-steps", "checkpoint-every-seconds",
      "metrics-out",    "max-steps",    "sample-tokens", "validation-fraction", "evaluate",
      "progress",   "algorithm",   "workers",    "shards",     "shard-cut",  "push-every",     "worker-lr",    "worker-momentum",
      "worker-speeds", "prefetch",    "overlap",    "overlap-receive", "dc-lambda",  "dc-lambda0", "dc-rho-ms",      "ddc-alpha",    "ddc-mu0", "ddc-version", "ddc-tau-decay", "bucket-mb", "allreduce-dtype",
      "pipeline-stages", "micro-batches", "schedule", "pipeline-cuts", "stash",
      "placement", "device-speeds", "device-memory", "stage-devices", "link-cost", "profile-cache", "trace"};
  std::vector<std::string> table;
  for (const job_key& k : job_keys()) {
    table.push_back(k.name);
    CHECK_FALSE(k.value_name.empty());
    CHECK_FALSE(k.help.empty());
    CHECK_FALSE(k.expected.empty());
    CHECK(find_job_key(k.name) == &k);
  }
  CHECK(table == names);
  CHECK(find_job_key("wokers") == nullptr);
}

TEST_CASE("the help states each key's default as the settings hold it", "[job_file]") {
  // The help writes "(default {default})" and the table fills in the value of
  // a default job_spec; a default written by hand in the help must agree.
  const job_spec defaults;
  std::vector<job_key> keys = job_keys();
  keys.insert(keys.end(), cluster_keys().begin(), cluster_keys().end());
  int stated = 0;
  for (const job_key& k : keys) {
    INFO(k.name << ": " << k.help);
    CHECK(k.help.find("{default}") == std::string::npos);
    const std::size_t at = k.help.find("(default ");
    // data-dir: "" means the model's corpus; lists: "none" or "all equal" says what empty means
    if (at == std::string::npos || k.name == "data-dir" || std::holds_alternative<std::vector<double>>(k.get(defaults)))
      continue;
    const std::size_t from = at + 9, to = k.help.find_first_of(");:, ", from);
    const std::string said = k.help.substr(from, to - from);
    const job_value v = k.get(defaults);
    if (const double* d = std::get_if<double>(&v))
      CHECK(std::stod(said) == Approx(*d));
    else if (const int64_t* i = std::get_if<int64_t>(&v))
      CHECK(said == std::to_string(*i));
    else if (const bool* b = std::get_if<bool>(&v))
      CHECK(said == (*b ? "true" : "false"));
    else
      CHECK(said == std::get<std::string>(v));
    ++stated;
  }
  CHECK(stated >= 40);
}

TEST_CASE("closest_name suggests only close names", "[job_file]") {
  const std::vector<std::string> names{"workers", "shards", "lr", "seed"};
  CHECK(closest_name("wokers", names) == "workers");
  CHECK(closest_name("shard", names) == "shards");
  CHECK(closest_name("lrr", names) == "lr");
  CHECK(closest_name("colour", names).empty());
  CHECK(closest_name("x", names).empty());
}

TEST_CASE("make_job builds the named zoo model on the spec's data with its settings", "[job_file]") {
  job_spec spec;
  spec.model = "mlp";
  spec.data_dir = "/data/idx";
  spec.train.epochs = 3;
  spec.train.algo.kind = algorithm_kind::asgd;
  spec.train.algo.workers = 2;
  const troupe::job j = make_job(spec);
  CHECK(j.model_name() == "mlp");
  CHECK(j.data_source().description() == "IDX files in /data/idx");
  CHECK(j.config().epochs == 3);
  CHECK(j.config().algo.workers == 2);
  CHECK(j.build_model(shape{1, 28, 28}).num_parameters() ==
        zoo::mlp().build(shape{1, 28, 28}).num_parameters());

  spec.data_dir.clear();
  CHECK_THAT(make_job(spec).data_source().description(), Contains("fashion-mnist"));
  spec.model = "vgg";
  CHECK_THROWS_MATCHES(make_job(spec), error, message(Contains("unknown model 'vgg'")));
}

TEST_CASE("a value the job does not read is noted, naming the jobs that read it", "[job_file]") {
  job_spec s = parse_job_file("algorithm = \"asgd\"\nbucket-mb = 4\nallreduce-dtype = \"bf16\"\nworker-lr = 0.5\n",
                              "job.toml");
  std::vector<std::string> notes = unread_keys(s);
  REQUIRE(notes.size() == 3);
  CHECK(notes[0] == "--worker-lr 0.5 has no effect: only a job with --push-every > 1 reads it");
  CHECK(notes[1] == "--bucket-mb 4.0 has no effect: only --algorithm allreduce reads it");
  CHECK(notes[2] == "--allreduce-dtype bf16 has no effect: only --algorithm allreduce reads it");
  // Read: nothing to note. The defaults given again are not noted either.
  s.train.algo.kind = algorithm_kind::allreduce;
  s.train.algo.push_every = 1;
  s.train.algo.worker_lr = 0;
  CHECK(unread_keys(s).empty());
  s = parse_job_file("algorithm = \"asgd\"\nbucket-mb = 1\ndc-lambda0 = 3\n", "job.toml");
  notes = unread_keys(s);
  REQUIRE(notes.size() == 1);
  CHECK(notes[0] == "--dc-lambda0 3.0 has no effect: only --algorithm dc-asgd-a or ddc-asgd reads it");
  s.train.algo.kind = algorithm_kind::ddc_asgd;
  CHECK(unread_keys(s).empty());
  // A language model's keys: noted for an image model; gpt's own defaults are not a change.
  s = parse_job_file("model = \"mlp\"\ncontext = 64\nsample-tokens = 10\n", "job.toml");
  CHECK(unread_keys(s) == std::vector<std::string>{"--context 64 has no effect: only --model gpt reads it",
                                                   "--sample-tokens 10 has no effect: only --model gpt reads it"});
  s.model = "gpt";
  CHECK(unread_keys(s).empty());
  CHECK(unread_keys(parse_job_file("model = \"gpt\"\n", "job.toml")).empty());
  s = parse_job_file("model = \"cnn\"\ndim = 64\nheads = 2\nblocks = 2\nmlp-ratio = 2\n", "job.toml");
  CHECK(unread_keys(s) == std::vector<std::string>{"--dim 64 has no effect: only --model gpt reads it",
                                                   "--heads 2 has no effect: only --model gpt reads it",
                                                   "--blocks 2 has no effect: only --model gpt reads it",
                                                   "--mlp-ratio 2 has no effect: only --model gpt reads it"});
  s.model = "gpt";
  CHECK(unread_keys(s).empty());
  CHECK_THROWS_MATCHES(parse_job_file("model = \"gpt\"\ndim = 64\nheads = 3\n", "job.toml"), error,
                       message(Contains("--heads 3 does not divide --dim 64")));
  CHECK_THROWS_MATCHES(parse_job_file("model = \"gpt\"\nheads = 0\n", "job.toml"), error,
                       message(Contains("heads")));
  // A gpt whose state and attention probabilities exceed the memory: an error before anything is built.
  s = parse_job_file("model = \"gpt\"\nbatch-size = 32\n", "job.toml");
  CHECK_NOTHROW(check_language_model_size(s, 1e9));  // 0.88 M parameters (10.5 MB with SGD), 33.6 MB of probabilities
  CHECK_NOTHROW(check_language_model_size(s, 0));    // memory unknown: not checked
  CHECK_THROWS_MATCHES(check_language_model_size(s, 1e6), error,
                       message(Contains("--dim 128, --heads 4, --blocks 4, --mlp-ratio 4, --context 128 and "
                                        "--batch-size 32 make a gpt of about 0.876 M parameters whose step needs at "
                                        "least 0.044 GB (0.011 for the weights, gradients and optimizer state, 0.034 "
                                        "for the attention probabilities), more than this machine's 0.001 GB of "
                                        "memory")));
  CHECK_THROWS_MATCHES(parse_job_file("model = \"gpt\"\ndim = 8192\nheads = 8\nblocks = 1024\n", "job.toml"),
                       error, message(Contains("more than this machine's")));
  s.context = 4096;  // 34 GB of probabilities for 32 windows in 4 blocks
  CHECK_THROWS_MATCHES(check_language_model_size(s, 25e9), error, message(Contains("34.4 for the attention")));
  s.train.batch_size = 8;
  CHECK_NOTHROW(check_language_model_size(s, 25e9));
  s.context = 128;  // SGD without momentum keeps no velocity: weights and gradients, 2 x 4 bytes a parameter
  s.train.momentum = 0;
  CHECK_THROWS_MATCHES(check_language_model_size(s, 1e6), error, message(Contains("(0.007 for the weights")));
  // The sequential loop writes no timeline and has no data loaders.
  s = parse_job_file("trace = \"t.json\"\nprefetch = 4\n", "job.toml");
  const std::string on_actors = "only a run on actors (an --algorithm other than sequential, or --pipeline-stages > 1) "
                                "reads it";
  CHECK(unread_keys(s) == std::vector<std::string>{"--prefetch 4 has no effect: " + on_actors,
                                                   "--trace t.json has no effect: " + on_actors});
  s.train.pipeline.stages = 2;
  CHECK(unread_keys(s).empty());
  s.train.pipeline.stages = 1;
  s.train.algo.kind = algorithm_kind::allreduce;
  CHECK(unread_keys(s).empty());
  // Overlap: read by workers that push during backward; --overlap-receive only with --overlap true.
  const std::string pushing = "a run of workers that push during backward (on actors, no pipeline, not hogwild; "
                              "allreduce, or --push-every 1 without --clip-grad-norm) reads it";
  s = parse_job_file("algorithm = \"asgd\"\noverlap = false\noverlap-receive = false\n", "job.toml");
  CHECK(unread_keys(s) == std::vector<std::string>{"--overlap-receive false has no effect: only --overlap true in " +
                                                   pushing});
  s.train.algo.overlap = true;
  CHECK(unread_keys(s).empty());
  s.train.algo.kind = algorithm_kind::allreduce;
  CHECK(unread_keys(s).empty());
  s.train.algo.overlap = false;
  const std::vector<std::string> both{"--overlap false has no effect: only " + pushing,
                                      "--overlap-receive false has no effect: only --overlap true in " + pushing};
  for (const char* other : {"algorithm = \"sequential\"", "algorithm = \"hogwild\"",
                            "algorithm = \"ssgd\"\nclip-grad-norm = 1.0", "algorithm = \"asgd\"\npush-every = 2",
                            "algorithm = \"allreduce\"\npipeline-stages = 2"}) {
    CAPTURE(other);
    s = parse_job_file(std::string("overlap = false\noverlap-receive = false\n") + other + "\n", "job.toml");
    CHECK(unread_keys(s) == both);
  }
  // Every key the table marks names the jobs that read it.
  for (const job_key& k : job_keys()) CHECK(k.applies_to.empty() == !k.applies);
}
