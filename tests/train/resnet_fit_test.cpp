// Residual networks through troupe::fit: in the sequential loop and on
// actors, their parameters on two shards with DDC-ASGD, batch norm's
// statistics in the evaluation and the checkpoint.
#include <catch2/catch.hpp>

#include <sstream>

#include "actors/fit.hpp"
#include "model/nn.hpp"
#include "model/zoo.hpp"
#include "net/checkpoint.hpp"
#include "train/evaluate.hpp"
#include "tests/test_util.hpp"

using namespace troupe;
using namespace troupe::nn;
using Catch::Matchers::Contains;

namespace {

/// 1024 training and 200 test images of the synthetic 28x28 task.
struct data_dir {
  testing::temp_dir dir{"troupe_resnet"};
  data_dir() {
    testing::write_split(dir.path(), "train", 1024, 1);
    testing::write_split(dir.path(), "t10k", 200, 2);
  }
};

/// A ResNet of the zoo's shape, small enough for a test.
model::model tiny_resnet() {
  return sequential(conv2d(1, 8, 3).stride(2).padding(1).bias(false), batch_norm(8), relu(),
                    residual(conv2d(8, 8, 3).padding(1).bias(false), batch_norm(8), relu(),
                             conv2d(8, 8, 3).padding(1).bias(false), batch_norm(8)),
                    relu(),
                    residual(conv2d(8, 16, 3).stride(2).padding(1).bias(false), batch_norm(16), relu(),
                             conv2d(16, 16, 3).padding(1).bias(false), batch_norm(16))
                        .projection(conv2d(8, 16, 1).stride(2).bias(false), batch_norm(16)),
                    relu(), global_avg_pool(), dense(16, 10));
}

job resnet_job(const std::string& dir, algorithm a) {
  return job()
      .model(tiny_resnet, "tiny-resnet")
      .data(data::idx_dir(dir))
      .algorithm(a)
      .epochs(2)
      .batch_size(32)
      .lr(0.05f)
      .schedule(lr_schedule::constant)
      .seed(3)
      .threads(2)
      .progress(progress_mode::none);
}

} // namespace

TEST_CASE("a residual network trains in the sequential loop", "[train][fit]") {
  data_dir d;
  std::ostringstream log;
  history h = fit(resnet_job(d.dir.path(), sequential_sgd()).momentum(0.9f), log);
  REQUIRE(h.size() == 2);
  CHECK(h[1].train_loss < h[0].train_loss);
  CHECK(h[1].test_accuracy > 0.9);
}

TEST_CASE("a residual network on 2 shards trains with DDC-ASGD on 4 workers, evaluation and checkpoint carry "
          "batch norm's statistics",
          "[actors][fit]") {
  data_dir d;
  std::ostringstream log;
  const std::string ckpt = d.dir.file("resnet.ckpt");
  job j = resnet_job(d.dir.path(), ddc_asgd().workers(4).shards(2)).epochs(3).checkpoint(ckpt);
  history h = fit(j, log);
  REQUIRE(h.size() == 3);
  CHECK(h[2].train_loss < h[0].train_loss);
  // Asynchronous: the order of the updates, and so the accuracy, varies from run to run (0.88-0.98 in
  // 12 runs on 2 cores); chance is 0.1.
  CHECK(h[2].test_accuracy > 0.8);

  net::checkpoint c = net::load_checkpoint(ckpt);
  REQUIRE(c.shard_versions.size() == 2);
  bool has_stats = false;
  for (const named_tensor& e : c.params)
    if (e.name == "3.residual.1.batch_norm.running_var") {
      has_stats = true;
      // Estimated from training batches, not the initial ones.
      bool all_one = true;
      for (float v : e.value.to_vector()) all_one &= v == 1.0f;
      CHECK(!all_one);
    }
  CHECK(has_stats);
  CHECK(evaluate(j, ckpt, log).test_accuracy == h[2].test_accuracy);
}

TEST_CASE("the zoo's resnet runs a few steps with DDC-ASGD on 2 shards", "[actors][fit]") {
  data_dir d;
  std::ostringstream log;
  job j = resnet_job(d.dir.path(), ddc_asgd().workers(2).shards(2)).model([] { return zoo::resnet(); }, "resnet")
              .epochs(1)
              .max_steps(6)
              .batch_size(16)
              .evaluate(false);
  history h = fit(j, log);
  REQUIRE(h.size() == 1);
  CHECK(h[0].steps == 6);
  CHECK(std::isfinite(h[0].train_loss));
  CHECK_THAT(log.str(), Contains("model resnet: 272186 parameters"));
}
