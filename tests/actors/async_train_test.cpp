// Training on actors, end to end, on a small synthetic Fashion-MNIST-shaped set.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "actors/async_train.hpp"
#include "net/checkpoint.hpp"
#include "tests/test_util.hpp"

using namespace troupe;
using Catch::Matchers::Contains;

namespace {

struct dataset_dir {
  testing::temp_dir dir{"troupe_async"};
  dataset_dir() {
    testing::write_split(dir.path(), "train", 1024, 1);
    testing::write_split(dir.path(), "t10k", 200, 2);
  }
};

train::options small(const std::string& data_dir, const std::string& algorithm, int workers) {
  train::options o;
  o.model = "mlp";
  o.epochs = 2;
  o.batch_size = 32;
  o.lr = 0.05f;
  o.momentum = 0.0f;
  o.lr_schedule = "constant";
  o.seed = 3;
  o.threads = 2;
  o.data_dir = data_dir;
  o.progress = "none";
  o.algorithm = algorithm;
  o.workers = workers;
  return o;
}

} // namespace

TEST_CASE("one ASGD worker on actors reproduces the sequential loop's losses for 100 steps", "[actors][async]") {
  dataset_dir d;
  std::ostringstream log;
  train::options seq = small(d.dir.path(), "sequential", 1);
  seq.epochs = 4;  // 32 steps per epoch
  seq.max_steps = 100;
  std::vector<double> expected, got;
  seq.on_step = [&](int64_t, double loss) { expected.push_back(loss); };
  train::run(seq, log);

  train::options async = seq;
  async.algorithm = "asgd";
  async.on_step = [&](int64_t, double loss) { got.push_back(loss); };
  actors::run_async(async, log);

  REQUIRE(expected.size() == 100);
  REQUIRE(got.size() == 100);
  for (std::size_t i = 0; i < expected.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(std::abs(got[i] - expected[i]) <= 1e-5);
  }
}

TEST_CASE("asynchronous algorithms train with several workers and report staleness", "[actors][async]") {
  dataset_dir d;
  for (std::string algo : {"asgd", "ssgd", "hogwild", "ddc-asgd", "dc-asgd-c"}) {
    INFO(algo);
    std::ostringstream log;
    train::options o = small(d.dir.path(), algo, 4);
    o.metrics_out = d.dir.path() + "/" + algo + ".jsonl";
    auto epochs = actors::run_async(o, log);
    REQUIRE(epochs.size() == 2);
    // The synthetic task is easy: every algorithm learns it.
    CHECK(epochs.back().test_accuracy > 0.8);
    const double tau = epochs.back().mean_staleness;
    if (algo == "ssgd") {
      CHECK(tau == 0.0);
    } else if (algo == "asgd") {
      // Each of 4 workers waits for its own reply while the 3 others are applied.
      CHECK(tau > 1.5);
      CHECK(tau < 4.5);
    }
    std::ifstream f(o.metrics_out);
    std::string line;
    REQUIRE(std::getline(f, line));
    CHECK_THAT(line, Contains("\"mean_staleness\":"));
    CHECK_THAT(line, Contains("\"algorithm\":\"" + algo + "\""));
  }
}

TEST_CASE("push-every, shards and speed factors run; staleness grows with slow workers", "[actors][async]") {
  dataset_dir d;
  std::ostringstream log;
  train::options o = small(d.dir.path(), "dc-asgd-a", 3);
  o.shards = 3;
  o.push_every = 2;
  o.speeds = {1, 1, 3};
  auto epochs = actors::run_async(o, log);
  REQUIRE(epochs.size() == 2);
  CHECK(epochs.back().test_accuracy > 0.8);
  CHECK(epochs.back().max_staleness >= 2);
}

TEST_CASE("run_async rejects bad configurations with a clear error", "[actors][async]") {
  dataset_dir d;
  std::ostringstream log;
  train::options o = small(d.dir.path(), "asgd", 2);
  o.speeds = {1, 2, 4};
  CHECK_THROWS_MATCHES(actors::run_async(o, log), troupe::error, testing::message(Contains("--speeds: 3 factors for 2 workers")));
  o = small(d.dir.path(), "asgd", 2);
  o.shards = 9;
  CHECK_THROWS_MATCHES(actors::run_async(o, log), troupe::error, testing::message(Contains("exceeds the model's 6")));
  o = small(d.dir.path(), "sequential", 2);
  CHECK_THROWS_MATCHES(train::validate(o), troupe::error, testing::message(Contains("need an asynchronous --algorithm")));
  o = small(d.dir.path(), "bogus", 1);
  CHECK_THROWS_MATCHES(train::validate(o), troupe::error, testing::message(Contains("unknown algorithm 'bogus'")));
  // A worker whose loss diverges stops the run with its reason, not a hang.
  o = small(d.dir.path(), "asgd", 2);
  o.lr = 1e6f;
  o.epochs = 3;
  CHECK_THROWS_MATCHES(actors::run_async(o, log), troupe::error, testing::message(Contains("worker")));
}

TEST_CASE("an asynchronous run checkpoints the shards' parameters and state, and resumes", "[actors][async]") {
  dataset_dir d;
  std::ostringstream log;
  train::options o = small(d.dir.path(), "ddc-asgd", 2);
  o.shards = 2;
  o.epochs = 1;
  o.checkpoint = d.dir.path() + "/run.ckpt";
  o.metrics_out = d.dir.path() + "/run.jsonl";
  auto first = actors::run_async(o, log);
  REQUIRE(first.size() == 1);
  {
    // Each shard's version and its rule's state (v, and MS per worker) are in the checkpoint.
    net::checkpoint c = net::load_checkpoint(o.checkpoint);
    CHECK(c.optimizer_kind == "ddc-asgd");
    REQUIRE(c.shard_versions.size() == 2);
    CHECK(c.shard_versions[0] > 0);
    std::vector<std::string> names;
    for (auto& t : c.optimizer) names.push_back(t.name);
    CHECK(names == std::vector<std::string>{"shard0/ms/0", "shard0/ms/1", "shard0/v", "shard1/ms/0", "shard1/ms/1", "shard1/v"});
  }
  o.epochs = 2;
  auto second = actors::run_async(o, log);
  REQUIRE(second.size() == 1);
  CHECK(second[0].epoch == 2);
  CHECK_THAT(log.str(), Contains("resumed from"));
  CHECK_THAT(log.str(), !Contains("starts fresh"));
  // The resumed run starts from the trained parameters, not from scratch.
  CHECK(second[0].train_loss < first[0].train_loss);
  std::ifstream f(o.metrics_out);
  int lines = 0;
  for (std::string line; std::getline(f, line);) ++lines;
  CHECK(lines == 2);
}
