// troupe::fit end to end, in the sequential loop and on actors, on small
// synthetic Fashion-MNIST-shaped data: training, records, checkpoints,
// callbacks, errors, and the 1-worker equivalence of the two paths.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/fit.hpp"
#include "model/nn.hpp"
#include "model/zoo.hpp"
#include "net/checkpoint.hpp"
#include "train/evaluate.hpp"
#include "tests/test_util.hpp"
#include "tests/train/fit_util.hpp"

using namespace troupe;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using testing::message;

namespace {

/// 256 training and 64 test images where class k lights up block k.
struct small_data {
  testing::temp_dir dir{"troupe_fit"};
  small_data() { testing::write_dataset(dir.path()); }
};

/// 1024 training and 200 test images.
struct larger_data {
  testing::temp_dir dir{"troupe_fit"};
  larger_data() {
    testing::write_split(dir.path(), "train", 1024, 1);
    testing::write_split(dir.path(), "t10k", 200, 2);
  }
};

job mlp_job(const std::string& data_dir, algorithm a = sequential_sgd()) {
  return job()
      .model([] { return zoo::mlp(); }, "mlp")
      .data(data::idx_dir(data_dir))
      .algorithm(a)
      .epochs(2)
      .batch_size(32)
      .lr(0.05f)
      .momentum(0.9f)
      // Constant: a resumed run must match an uninterrupted one step for step,
      // and a cosine schedule depends on the run's total length.
      .schedule(lr_schedule::constant)
      .seed(7)
      .threads(1)
      .progress(progress_mode::none);
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(f, line);) out.push_back(line);
  return out;
}

} // namespace

TEST_CASE("fit trains an MLP in the sequential loop and writes one record per epoch", "[train][fit]") {
  small_data d;
  job j = mlp_job(d.dir.path()).metrics_out(d.dir.file("metrics.jsonl"));
  std::ostringstream log;
  history h = fit(j, log);

  REQUIRE(h.size() == 2);
  CHECK(h[0].epoch == 1);
  CHECK(h[1].epoch == 2);
  CHECK(h[0].steps == 8);  // 256 / 32
  CHECK(h[1].steps == 16);
  for (const auto& m : h) {
    CHECK(std::isfinite(m.train_loss));
    CHECK(m.test_accuracy >= 0);
    CHECK(m.test_accuracy <= 1);
    CHECK(m.samples_per_s > 0);
    CHECK(m.lr == Approx(0.05));
  }
  CHECK(h[1].wall_s >= h[0].wall_s);
  CHECK(h[1].train_loss < h[0].train_loss);
  CHECK(h[1].train_loss < 0.5);
  CHECK(h[1].test_accuracy >= 0.9);

  std::vector<std::string> lines = read_lines(j.config().metrics_out);
  REQUIRE(lines.size() == 2);
  for (std::size_t i = 0; i < lines.size(); ++i) {
    INFO(lines[i]);
    CHECK(lines[i].front() == '{');
    CHECK(lines[i].back() == '}');
    for (const char* key : {"\"train_loss\":", "\"test_accuracy\":", "\"samples_per_s\":", "\"train_s\":",
                            "\"wall_s\":", "\"steps\":", "\"lr\":", "\"batch_size\":32", "\"threads\":1",
                            "\"peak_rss_mb\":", "\"algorithm\":\"sequential\"", "\"workers\":1",
                            "\"mean_staleness\":", "\"max_staleness\":", "\"rejected\":", "\"model\":\"mlp\""})
      CHECK_THAT(lines[i], Contains(key));
    CHECK_THAT(lines[i], Contains("\"epoch\":" + std::to_string(i + 1)));
    CHECK_THAT(lines[i], !Contains("null"));
  }
  CHECK_THAT(log.str(), Contains("256 train / 64 test"));
  CHECK_THAT(log.str(), Contains("epoch 2/2"));
}

TEST_CASE("fit measures accuracy on the test set", "[train][fit]") {
  // Test labels shifted by one class: a model that learnt the training set gets almost all wrong.
  testing::temp_dir dir;
  testing::write_split(dir.path(), "train", 256, 1);
  testing::write_split(dir.path(), "t10k", 64, 2, 1);
  std::ostringstream log;
  history h = fit(mlp_job(dir.path()), log);
  REQUIRE(h.size() == 2);
  CHECK(h[1].train_loss < 0.5);
  CHECK(h[1].test_accuracy <= 0.2);
}

TEST_CASE("fit with the same seed gives the same losses", "[train][fit]") {
  small_data d;
  std::ostringstream log;
  history a = fit(mlp_job(d.dir.path()), log);
  history b = fit(mlp_job(d.dir.path()), log);
  REQUIRE(a.size() == 2);
  REQUIRE(b.size() == 2);
  for (int i = 0; i < 2; ++i) {
    CHECK(a[i].train_loss == b[i].train_loss);
    CHECK(a[i].test_accuracy == b[i].test_accuracy);
  }
  history c = fit(mlp_job(d.dir.path()).seed(8), log);
  REQUIRE(c.size() == 2);
  CHECK(c[0].train_loss != a[0].train_loss);
}

TEST_CASE("fit with --gemm auto, own or eigen trains as with OpenBLAS, up to float rounding", "[train][fit]") {
  small_data d;
  std::ostringstream log;
  const history a = fit(mlp_job(d.dir.path()).gemm(kernels::gemm_backend::openblas), log);
  for (kernels::gemm_backend b :
       {kernels::gemm_backend::automatic, kernels::gemm_backend::own, kernels::gemm_backend::eigen}) {
    INFO(kernels::to_string(b));
    const history o = fit(mlp_job(d.dir.path()).gemm(b), log);
    REQUIRE(o.size() == a.size());
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(o[i].train_loss == Approx(a[i].train_loss).epsilon(1e-3));
  }
}

TEST_CASE("fit resumes the sequential loop from its checkpoint, evaluate reads it", "[train][fit]") {
  small_data d;
  const std::string ckpt = d.dir.file("run.ckpt");
  std::ostringstream log1;
  history first = fit(mlp_job(d.dir.path()).checkpoint(ckpt), log1);
  REQUIRE(first.size() == 2);
  CHECK(std::filesystem::exists(ckpt));
  CHECK_THAT(log1.str(), !Contains("resumed"));

  std::ostringstream log2;
  history second = fit(mlp_job(d.dir.path()).checkpoint(ckpt).epochs(3), log2);
  REQUIRE(second.size() == 1);
  CHECK(second[0].epoch == 3);
  CHECK(second[0].steps == 24);
  CHECK_THAT(log2.str(), Contains("resumed from " + ckpt + " after epoch 2 (16 steps)"));

  // The resumed run continues exactly where an uninterrupted one would be.
  std::ostringstream log3;
  history whole = fit(mlp_job(d.dir.path()).epochs(3), log3);
  REQUIRE(whole.size() == 3);
  CHECK(whole[1].train_loss == first[1].train_loss);
  CHECK(whole[2].train_loss == second[0].train_loss);
  CHECK(whole[2].test_accuracy == second[0].test_accuracy);

  // Evaluating the checkpoint gives the accuracy the last epoch recorded.
  evaluation e = evaluate(mlp_job(d.dir.path()), ckpt, log3);
  CHECK(e.epochs == 3);
  CHECK(e.steps == 24);
  CHECK(e.samples == 64);
  CHECK(e.test_accuracy == second[0].test_accuracy);
  CHECK(e.test_loss > 0);

  // Everything done: a further run trains nothing.
  std::ostringstream log4;
  CHECK(fit(mlp_job(d.dir.path()).checkpoint(ckpt).epochs(3), log4).empty());
}

TEST_CASE("fit honours max_steps, evaluate(false) and the cosine schedule", "[train][fit]") {
  small_data d;
  std::ostringstream log;
  SECTION("max_steps stops inside the first epoch; its checkpoint does not claim the epoch") {
    const std::string ckpt = d.dir.file("cut.ckpt");
    history h = fit(mlp_job(d.dir.path()).max_steps(5).checkpoint(ckpt), log);
    REQUIRE(h.size() == 1);
    CHECK(h[0].steps == 5);
    net::checkpoint c = net::load_checkpoint(ckpt);
    CHECK(c.step == 5);
    CHECK(c.epoch == 0);
  }
  SECTION("without evaluation the accuracy is -1 and null in JSON") {
    job j = mlp_job(d.dir.path()).epochs(1).evaluate(false).metrics_out(d.dir.file("m.jsonl"));
    history h = fit(j, log);
    REQUIRE(h.size() == 1);
    CHECK(h[0].test_accuracy == -1);
    auto lines = read_lines(j.config().metrics_out);
    REQUIRE(lines.size() == 1);
    CHECK_THAT(lines[0], Contains("\"test_accuracy\":null"));
  }
  SECTION("cosine: the last step uses 0.5 lr (1 + cos(pi * 15 / 16))") {
    history h = fit(mlp_job(d.dir.path()).schedule(lr_schedule::cosine), log);
    REQUIRE(h.size() == 2);
    const double pi = std::acos(-1.0);
    CHECK(h[0].lr == Approx(0.5 * 0.05 * (1 + std::cos(pi * 7 / 16))).epsilon(1e-5));
    CHECK(h[1].lr == Approx(0.5 * 0.05 * (1 + std::cos(pi * 15 / 16))).epsilon(1e-5));
  }
}

// Bug (issue 21, item 18): a run resumed from a checkpoint inside an epoch
// trained that epoch again from its start, and its record counted the steps
// before the checkpoint twice (3 + 8 steps for an epoch of 8).
TEST_CASE("accumulating 4 batches of 8 trains as batches of 32, step for step, and resumed inside an epoch too",
          "[train][fit]") {
  small_data d;  // 256 images: 8 batches of 32, 32 of 8
  std::ostringstream log;
  auto losses = [&](job j, history* h = nullptr) {
    std::vector<step_event> steps;
    j.on_step([&](const step_event& e) { steps.push_back(e); });
    const history got = fit(j, log);
    if (h) *h = got;
    return steps;
  };
  history whole, accumulated;
  const auto big = losses(mlp_job(d.dir.path()), &whole);
  const auto small = losses(mlp_job(d.dir.path()).batch_size(8).accumulate(4), &accumulated);
  CHECK_THAT(log.str(), Contains(", 4 batches of 8 per step (32 samples)"));
  REQUIRE(big.size() == 16);
  REQUIRE(small.size() == 16);
  for (std::size_t i = 0; i < big.size(); ++i) {
    INFO("step " << big[i].step);
    CHECK(small[i].step == big[i].step);
    CHECK(std::abs(small[i].loss - big[i].loss) <= 1e-5 * std::abs(big[i].loss));
  }
  REQUIRE(accumulated.size() == 2);
  CHECK(accumulated[1].steps == 16);
  CHECK(std::abs(accumulated[1].test_accuracy - whole[1].test_accuracy) <= 1.0 / 64);  // one test image at most
  // 32 batches in threes: 10 steps of 3 and an epoch's last step of the 2 left.
  history thirds;
  CHECK(losses(mlp_job(d.dir.path()).batch_size(8).accumulate(3), &thirds).size() == 22);
  CHECK(thirds[0].steps == 11);
  // Cut after 3 steps (96 samples) and resumed: the rest as in the run never cut.
  const std::string ckpt = d.dir.file("accumulated.ckpt");
  fit(mlp_job(d.dir.path()).batch_size(8).accumulate(4).max_steps(3).checkpoint(ckpt), log);
  CHECK(net::load_checkpoint(ckpt).epoch_samples == 96);
  const auto rest = losses(mlp_job(d.dir.path()).batch_size(8).accumulate(4).checkpoint(ckpt));
  REQUIRE(rest.size() == 13);
  for (std::size_t i = 0; i < rest.size(); ++i) {
    INFO("step " << rest[i].step);
    CHECK(rest[i].step == small[i + 3].step);
    CHECK(rest[i].loss == small[i + 3].loss);
  }
  // On actors a worker's batch is the batch: a clear error.
  CHECK_THROWS_MATCHES(fit(mlp_job(d.dir.path(), asgd().workers(2)).accumulate(2), log), error,
                       message(Contains("--accumulate 2 is the sequential loop's")));
}

TEST_CASE("fit resumed inside an epoch trains the rest of it: the epoch records its own steps", "[train][fit]") {
  small_data d;  // 8 steps per epoch
  const std::string ckpt = d.dir.file("mid.ckpt");
  std::ostringstream log;
  const history cut = fit(mlp_job(d.dir.path()).max_steps(3).checkpoint(ckpt), log);
  REQUIRE(cut.size() == 1);
  CHECK(cut[0].steps == 3);
  const net::checkpoint c = net::load_checkpoint(ckpt);
  CHECK(c.epoch == 0);
  CHECK(c.step == 3);
  CHECK(c.epoch_samples == 3 * 32);

  std::vector<step_event> resumed, straight;
  job rest = mlp_job(d.dir.path()).checkpoint(ckpt);
  rest.on_step([&](const step_event& e) { resumed.push_back(e); });
  const history h = fit(rest, log);
  CHECK_THAT(log.str(), Contains("resumed from " + ckpt + " after epoch 0 (3 steps), 96 samples into epoch 1"));
  REQUIRE(h.size() == 2);
  CHECK(h[0].epoch == 1);
  CHECK(h[0].steps == 8);  // 3 before the checkpoint, 5 after
  CHECK(h[1].steps == 16);
  CHECK(net::load_checkpoint(ckpt).epoch_samples == 0);  // whole epochs done

  // The same steps on the same batches as a run that was never cut.
  job whole = mlp_job(d.dir.path());
  whole.on_step([&](const step_event& e) { straight.push_back(e); });
  const history w = fit(whole, log);
  REQUIRE(straight.size() == 16);
  REQUIRE(resumed.size() == 13);
  for (std::size_t i = 0; i < resumed.size(); ++i) {
    INFO("step " << straight[i + 3].step);
    CHECK(resumed[i].step == straight[i + 3].step);
    CHECK(resumed[i].epoch == straight[i + 3].epoch);
    CHECK(resumed[i].loss == straight[i + 3].loss);
  }
  CHECK(h[1].train_loss == w[1].train_loss);
  CHECK(h[1].test_accuracy == w[1].test_accuracy);
}

TEST_CASE("fit reports what is missing or wrong before it trains", "[train][fit]") {
  testing::temp_dir dir;
  std::ostringstream log;
  CHECK_THROWS_MATCHES(fit(job().data(data::idx_dir(dir.path())), log), troupe::error,
                       message(Contains("the job has no model")));
  CHECK_THROWS_MATCHES(fit(job().model([] { return zoo::mlp(); }), log), troupe::error,
                       message(Contains("the job has no data")));
  CHECK_THROWS_MATCHES(fit(mlp_job(dir.file("nothing-here")), log), troupe::error,
                       message(Contains(dir.file("nothing-here")) && Contains("--data-dir")));
  CHECK_THROWS_MATCHES(fit(mlp_job(dir.path()).epochs(0), log), troupe::error, message(Contains("--epochs")));
  testing::write_dataset(dir.path());
  CHECK_THROWS_MATCHES(fit(mlp_job(dir.path()).metrics_out(dir.file("no-such-dir/m.jsonl")), log), troupe::error,
                       message(Contains("--metrics-out") && Contains("no-such-dir/m.jsonl")));
  // A checkpoint of another model.
  fit(mlp_job(dir.path()).epochs(1).max_steps(1).evaluate(false).checkpoint(dir.file("mlp.ckpt")), log);
  job cnn = mlp_job(dir.path()).model([] { return zoo::cnn(); }, "cnn").checkpoint(dir.file("mlp.ckpt"));
  CHECK_THROWS_MATCHES(fit(cnn, log), troupe::error, message(Contains("another architecture")));
  // A model that does not fit the data names the layer.
  job bad = mlp_job(dir.path()).model([] { return nn::sequential(nn::flatten(), nn::dense(100, 10)); });
  CHECK_THROWS_MATCHES(fit(bad, log), troupe::error, message(Contains("dense #2 expects 100 inputs")));
}

TEST_CASE("a user's model and in-memory data train with DDC-ASGD on 4 workers", "[train][fit][actors]") {
  // Two Gaussian blobs in 8 dimensions, classes 0 and 1, generated here.
  auto blobs = [](int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> noise(0.0f, 1.0f);
    tensor x = tensor::empty({n, 8});
    std::vector<int32_t> y(n);
    for (int i = 0; i < n; ++i) {
      y[i] = i % 2;
      for (int k = 0; k < 8; ++k) x.at(i * 8 + k) = noise(rng) + (y[i] ? 1.5f : -1.5f);
    }
    return std::make_pair(x, y);
  };
  auto [train_x, train_y] = blobs(512, 1);
  auto [test_x, test_y] = blobs(128, 2);
  job j = job()
              .model([] { return nn::sequential(nn::dense(8, 16), nn::relu(), nn::dense(16, 2)); }, "blobs")
              .data(data::in_memory(train_x, train_y, test_x, test_y, 2))
              .algorithm(ddc_asgd().workers(4).shards(2))
              .epochs(2)
              .batch_size(16)
              .lr(0.05f)
              .threads(2)
              .progress(progress_mode::none);
  std::ostringstream log;
  history h = fit(j, log);
  REQUIRE(h.size() == 2);
  CHECK(h.back().test_accuracy > 0.95);
  CHECK(h.back().steps == 64);  // 4 loaders of 128 samples, batches of 16, 2 epochs
  CHECK_THAT(log.str(), Contains("512 train / 128 test samples from in-memory data"));
  CHECK_THAT(log.str(), Contains("model blobs"));
}

TEST_CASE("a --profile-cache file that cannot be read is measured again, with a warning in the run's log",
          "[actors][fit][pipeline]") {
  std::mt19937 rng(3);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  tensor x = tensor::empty({64, 8});
  std::vector<int32_t> y(64);
  for (int i = 0; i < 64; ++i) {
    y[i] = i % 2;
    for (int k = 0; k < 8; ++k) x.at(i * 8 + k) = noise(rng) + (y[i] ? 1.0f : -1.0f);
  }
  testing::temp_dir dir;
  const std::string cache = dir.file("costs.txt");
  std::ofstream(cache) << "not a profile\n";
  // A model of its own: the process keeps measured costs per architecture, and no other test measures this one.
  job j = job()
              .model([] { return nn::sequential(nn::dense(8, 13), nn::relu(), nn::dense(13, 2)); }, "cached")
              .data(data::in_memory(x, y, x, y, 2))
              .pipeline(2, 2, pipeline_schedule::gpipe)
              .placement(placement_kind::greedy, {1, 2})
              .batch_size(16)
              .max_steps(2)
              .evaluate(false)
              .progress(progress_mode::none);
  settings s = j.config();
  s.pipeline.profile_cache = cache;
  j.configure(s);
  std::ostringstream log;
  fit(j, log);
  CHECK_THAT(log.str(), Contains("warning: ") && Contains("measuring again"));
  std::ifstream in(cache);
  const std::string written((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK_THAT(written, !Contains("not a profile"));  // replaced by the costs measured
}

TEST_CASE("callbacks see every step and epoch and can stop the run", "[train][fit]") {
  larger_data d;
  for (algorithm a : {sequential_sgd(), asgd().workers(2)}) {
    const bool actors = a.settings().kind != algorithm_kind::sequential;
    INFO(to_string(a.settings().kind));
    std::ostringstream log;
    std::vector<int64_t> steps;
    std::vector<int> epochs;
    job j = mlp_job(d.dir.path(), a).threads(2).epochs(5);
    j.on_step([&](const step_event& e) { steps.push_back(e.step); });
    j.on_epoch([&](const epoch_event& e) {
      epochs.push_back(e.epoch);
      if (e.epoch == 2) e.stop();
    });
    history h = fit(j, log);
    // The sequential loop stops right after epoch 2. On actors training goes on
    // while an epoch is evaluated: an epoch closed meanwhile is still recorded.
    REQUIRE(h.size() >= 2);
    CHECK(h.size() <= (actors ? 3u : 2u));
    CHECK(h[1].epoch == 2);
    CHECK(epochs.size() == h.size());
    REQUIRE(steps.size() >= 64);  // 32 steps per epoch
    for (std::size_t i = 0; i < steps.size(); ++i) CHECK(steps[i] == static_cast<int64_t>(i + 1));

    // A step callback stops the run inside an epoch: that epoch is recorded, partial.
    std::ostringstream log2;
    job k = mlp_job(d.dir.path(), a).threads(2).epochs(3);
    k.on_step([](const step_event& e) {
      if (e.step == 5) e.stop();
    });
    history cut = fit(k, log2);
    REQUIRE(cut.size() == 1);
    CHECK(cut[0].steps == 5);
  }
}

TEST_CASE("one ASGD worker on actors reproduces the sequential loop's losses for 100 steps", "[actors][fit]") {
  larger_data d;
  std::ostringstream log;
  std::vector<double> expected, got;
  job seq = mlp_job(d.dir.path()).momentum(0.0f).threads(2).epochs(4).max_steps(100);  // 32 steps per epoch
  seq.on_step([&](const step_event& e) { expected.push_back(e.loss); });
  fit(seq, log);
  REQUIRE(expected.size() == 100);
  // One shard; three shards with each shard's push sent during backward
  // (pipelined execution: the next forward pass running each shard's layers
  // as its weights arrive, or waiting for every shard) and after it
  // (linear): the same steps.
  // Cut evenly (--shard-cut even), 3 and 7 shards cut the MLP's tensors
  // across shards: their parts are copied in and out, the steps the same.
  struct mode {
    int shards;
    bool overlap, receive;
    model::shard_cut cut = model::shard_cut::tensors;
  };
  const model::shard_cut even = model::shard_cut::even;
  for (mode m : {mode{1, true, true}, mode{3, true, true}, mode{3, true, false}, mode{3, false, false},
                 mode{3, true, true, even}, mode{7, true, false, even}, mode{7, false, false, even}}) {
    INFO(m.shards << " shard(s), overlap " << m.overlap << ", receiving per layer " << m.receive << ", cut "
                  << model::to_string(m.cut));
    job async = seq;
    async.algorithm(asgd().shards(m.shards).overlap(m.overlap).overlap_receive(m.receive).shard_cut(m.cut));
    got.clear();
    async.on_step([&](const step_event& e) { got.push_back(e.loss); });
    fit(async, log);
    REQUIRE(got.size() == 100);
    for (std::size_t i = 0; i < expected.size(); ++i) {
      INFO("step " << i + 1);
      CHECK(std::abs(got[i] - expected[i]) <= 1e-5);
    }
  }
}

TEST_CASE("one allreduce worker reproduces the sequential loop, momentum and all, for 100 steps", "[actors][fit][allreduce]") {
  larger_data d;
  std::ostringstream log;
  std::vector<double> expected, got;
  job seq = mlp_job(d.dir.path()).threads(2).epochs(4).max_steps(100);  // 32 steps per epoch
  seq.on_step([&](const step_event& e) { expected.push_back(e.loss); });
  fit(seq, log);
  REQUIRE(expected.size() == 100);
  for (float bucket_mb : {0.0f, 0.001f}) {
    INFO("buckets of " << bucket_mb << " MB");
    job ar = seq;
    ar.algorithm(allreduce().bucket_mb(bucket_mb));
    got.clear();
    ar.on_step([&](const step_event& e) { got.push_back(e.loss); });
    fit(ar, log);
    REQUIRE(got.size() == 100);
    for (std::size_t i = 0; i < expected.size(); ++i) {
      INFO("step " << i + 1);
      CHECK(std::abs(got[i] - expected[i]) <= 1e-5);
    }
  }
}

TEST_CASE("gradient clipping: the sequential loop, one allreduce worker and one ASGD worker clip alike, and it changes the steps",
          "[actors][fit][allreduce][clip]") {
  larger_data d;
  using testing::losses_of;
  job seq = mlp_job(d.dir.path()).threads(2).epochs(2).max_steps(50);
  const std::vector<double> plain = losses_of(seq);
  seq.clip_grad_norm(0.05f);
  const std::vector<double> clipped = losses_of(seq);
  job ar = seq;
  ar.algorithm(allreduce());
  const std::vector<double> ar_clipped = losses_of(ar);
  REQUIRE(clipped.size() == 50);
  REQUIRE(ar_clipped.size() == 50);
  double changed = 0;
  for (std::size_t i = 0; i < 50; ++i) {
    INFO("step " << i + 1);
    CHECK(std::abs(ar_clipped[i] - clipped[i]) <= 1e-5);
    changed = std::max(changed, std::abs(clipped[i] - plain[i]));
  }
  CHECK(changed > 1e-3);  // a norm of 0.05 does clip this MLP's gradients
  // One ASGD worker (over 1 or 3 shards) and one Hogwild! worker clip their
  // whole gradient before pushing or applying it: the sequential loop's plain
  // SGD (their step has no momentum).
  job plain_seq = job(seq).momentum(0.0f);
  const std::vector<double> sgd_clipped = losses_of(plain_seq);
  for (int shards : {0, 1, 3}) {
    INFO((shards ? std::to_string(shards) + " shard(s)" : std::string("Hogwild!")));
    REQUIRE(sgd_clipped.size() == 50);
    testing::check_same_losses(losses_of(job(plain_seq).algorithm(shards ? asgd().shards(shards) : hogwild())),
                               sgd_clipped, 1e-4);
  }
  // A pipeline's stages sum the squares of their norms first: GPipe is the sequential loop, clipped.
  const std::vector<double> expected = losses_of(seq);
  for (int stages : {2, 3}) {
    INFO(stages << " stages");
    REQUIRE(expected.size() == 50);
    testing::check_same_losses(losses_of(job(seq).pipeline(stages, 4, pipeline_schedule::gpipe)), expected, 1e-4);
  }
  // 1F1B clips each micro-batch's update by the whole model's norm: it trains.
  CHECK(losses_of(job(seq).pipeline(2, 4, pipeline_schedule::one_f_one_b)).back() < plain.front());
  // Hybrids: one replica by allreduce is the clipped GPipe pipeline (the mean over
  // one replica, then the stages' norm); one on an ASGD shard per stage is the clipped plain SGD.
  testing::check_same_losses(losses_of(job(seq).algorithm(allreduce()).pipeline(2, 4, pipeline_schedule::gpipe)),
                             expected, 1e-4);
  testing::check_same_losses(losses_of(job(plain_seq).algorithm(asgd()).pipeline(2, 4, pipeline_schedule::gpipe)),
                             sgd_clipped, 1e-4);
}

TEST_CASE("gradient clipping in hybrids: two replicas by allreduce clip their mean gradient and train, two on "
          "shards clip their own",
          "[actors][fit][pipeline][allreduce][clip]") {
  larger_data d;
  using testing::losses_of;
  job two = mlp_job(d.dir.path(), allreduce().workers(2)).threads(2).epochs(1).max_steps(60);
  two.pipeline(2, 4, pipeline_schedule::gpipe);
  const std::vector<double> plain = losses_of(two);
  history h;
  const std::vector<double> clipped = losses_of(job(two).clip_grad_norm(0.05f), &h);
  REQUIRE(clipped.size() == plain.size());
  double changed = 0;
  for (std::size_t i = 0; i < plain.size(); ++i) changed = std::max(changed, std::abs(clipped[i] - plain[i]));
  CHECK(changed > 1e-3);  // a norm of 0.05 clips this MLP's mean gradients
  REQUIRE(h.size() == 1);
  CHECK(h[0].train_loss < clipped.front());
  const std::vector<double> on_shards =
      losses_of(job(mlp_job(d.dir.path(), asgd().workers(2))).threads(2).epochs(2).max_steps(60).momentum(0.0f)
                    .pipeline(2, 4, pipeline_schedule::gpipe).clip_grad_norm(0.05f));
  REQUIRE(on_shards.size() > 20);
  // A step's loss is one mini-batch's (asynchronous replicas: noisy): the first and last 8 steps' means.
  const auto mean = [](auto first, auto last) { return std::accumulate(first, last, 0.0) / std::distance(first, last); };
  CHECK(mean(on_shards.end() - 8, on_shards.end()) < mean(on_shards.begin(), on_shards.begin() + 8));
}

TEST_CASE("allreduce resumes from its checkpoint: parameters, momentum and the epoch", "[actors][fit][allreduce]") {
  larger_data d;
  std::ostringstream log;
  const std::string ckpt = d.dir.file("ar.ckpt");
  job first = mlp_job(d.dir.path(), allreduce().workers(2)).threads(2).epochs(1).checkpoint(ckpt);
  history h1 = fit(first, log);
  REQUIRE(h1.size() == 1);
  job more = mlp_job(d.dir.path(), allreduce().workers(2)).threads(2).epochs(2).checkpoint(ckpt);
  history h2 = fit(more, log);
  REQUIRE(h2.size() == 1);
  CHECK(h2[0].epoch == 2);
  CHECK_THAT(log.str(), !Contains("state starts at 0"));
  CHECK(h2[0].test_accuracy > 0.8);
}

TEST_CASE("asynchronous algorithms train with several workers and report staleness", "[actors][fit]") {
  larger_data d;
  for (algorithm a : {asgd(), ssgd(), hogwild(), ddc_asgd(), dc_asgd_c(), sa_asgd(), dc_asgd_a(), allreduce()}) {
    const std::string name = to_string(a.settings().kind);
    INFO(name);
    std::ostringstream log;
    job j = mlp_job(d.dir.path(), a.workers(4)).momentum(0.0f).threads(2).metrics_out(d.dir.file(name + ".jsonl"));
    history h = fit(j, log);
    REQUIRE(h.size() == 2);
    // The synthetic task is easy: every algorithm learns it.
    CHECK(h.back().test_accuracy > 0.8);
    const double tau = h.back().mean_staleness;
    if (name == "ssgd" || name == "allreduce") {
      CHECK(tau == 0.0);
    } else if (name == "asgd") {
      // Each of 4 workers waits for its own reply while the 3 others are applied.
      CHECK(tau > 1.5);
      CHECK(tau < 4.5);
    }
    auto lines = read_lines(j.config().metrics_out);
    REQUIRE(lines.size() == 3);  // two epochs, then the workers' summary
    CHECK_THAT(lines[0], Contains("\"mean_staleness\":"));
    CHECK_THAT(lines[0], Contains("\"algorithm\":\"" + name + "\""));
    CHECK_THAT(lines[0], Contains("\"workers\":4"));
    CHECK_THAT(lines[2], StartsWith("{\"workers_summary\":[{\"worker\":0,"));
    CHECK_THAT(lines[2], Contains("{\"worker\":3,"));
  }
}

TEST_CASE("push-every, shards and speed factors run, staleness grows with slow workers", "[actors][fit]") {
  larger_data d;
  std::ostringstream log;
  job j = mlp_job(d.dir.path(), dc_asgd_a().workers(3).shards(3).push_every(2).worker_speeds({3, 3, 1})).momentum(0).threads(2)
              .metrics_out(d.dir.file("m.jsonl"));
  history h = fit(j, log);
  REQUIRE(h.size() == 2);
  CHECK(h.back().test_accuracy > 0.8);
  CHECK(h.back().max_staleness >= 2);
  // The summary's per-worker staleness: the slow worker's updates are the oldest, and it made the fewest.
  const auto lines = read_lines(d.dir.file("m.jsonl"));
  REQUIRE(lines.size() == 3);
  const auto w = nlohmann::json::parse(lines[2])["workers_summary"];
  REQUIRE(w.size() == 3);
  INFO(lines[2]);
  CHECK(w[2]["mean_staleness"].get<double>() > w[0]["mean_staleness"].get<double>());
  CHECK(w[2]["updates"].get<int>() < w[0]["updates"].get<int>());
  for (const auto& x : w) {
    CHECK(x["median_staleness"].get<int>() <= x["p90_staleness"].get<int>());
    CHECK(x["p90_staleness"].get<int>() <= x["max_staleness"].get<int>());
  }
  CHECK_THAT(log.str(), Contains("staleness per worker: mean from"));
}

TEST_CASE("a validation set held out of the training set is scored after every epoch", "[train][fit][actors]") {
  larger_data d;
  for (algorithm a : {sequential_sgd(), asgd().workers(2)}) {
    INFO(to_string(a.settings().kind));
    std::ostringstream log;
    job j = mlp_job(d.dir.path(), a).threads(2).validation_fraction(0.25).metrics_out(d.dir.file("v.jsonl"));
    history h = fit(j, log);
    REQUIRE(h.size() == 2);
    for (const auto& m : h) {
      CHECK(m.validation_accuracy > 0.5);
      CHECK(m.validation_accuracy <= 1);
    }
    CHECK_THAT(read_lines(d.dir.file("v.jsonl"))[0], Contains("\"validation_accuracy\":"));
    CHECK_THAT(log.str(), Contains("validation (held out)"));
    // Without it: none, and no such field in the record.
    history none = fit(mlp_job(d.dir.path(), a).threads(2).epochs(1).metrics_out(d.dir.file("n.jsonl")), log);
    CHECK(none[0].validation_accuracy == -1);
    CHECK_THAT(read_lines(d.dir.file("n.jsonl"))[0], !Contains("validation_accuracy"));
  }
  std::ostringstream log;
  CHECK_THROWS_MATCHES(fit(mlp_job(d.dir.path()).validation_fraction(1.0), log), troupe::error,
                       message(Contains("--validation-fraction: expected a number in [0, 1), got 1.0")));
}

TEST_CASE("a model whose outputs are not the data's classes is an error before training", "[train][fit][actors]") {
  larger_data d;
  for (const algorithm& a : {sequential_sgd(), asgd().workers(2), allreduce().workers(2)}) {
    INFO(to_string(a.settings().kind));
    std::ostringstream log;
    job j = mlp_job(d.dir.path(), a).model([] { return nn::sequential(nn::flatten(), nn::dense(784, 5)); }, "five");
    CHECK_THROWS_MATCHES(fit(j, log), troupe::error,
                         message(Contains("model five gives [5] outputs per sample, but the data has 10 classes")));
  }
  // More outputs than classes train (the extra logits are never a target).
  std::ostringstream log;
  job twelve = mlp_job(d.dir.path()).max_steps(3).model(
      [] { return nn::sequential(nn::flatten(), nn::dense(784, 12)); }, "twelve");
  CHECK(fit(twelve, log).size() == 1);
}

TEST_CASE("a checkpoint that cannot be written fails the run before its first step", "[train][fit][actors]") {
  larger_data d;
  for (const algorithm& a : {sequential_sgd(), asgd().workers(2)}) {
    INFO(to_string(a.settings().kind));
    std::ostringstream log;
    int steps = 0;
    job j = mlp_job(d.dir.path(), a).checkpoint(d.dir.file("no-such-dir/run.ckpt"));
    j.on_step([&](const step_event&) { ++steps; });
    CHECK_THROWS_MATCHES(fit(j, log), troupe::error,
                         message(Contains("--checkpoint: cannot write " + d.dir.file("no-such-dir/run.ckpt"))));
    CHECK(steps == 0);
  }
}

TEST_CASE("fit on actors rejects bad configurations with a clear error", "[actors][fit]") {
  larger_data d;
  std::ostringstream log;
  auto fails = [&](const job& j, const std::string& what) {
    CHECK_THROWS_MATCHES(fit(j, log), troupe::error, message(Contains(what)));
  };
  fails(mlp_job(d.dir.path(), asgd().workers(2).worker_speeds({4, 2, 1})), "--worker-speeds: 3 speeds for 2 workers");
  fails(mlp_job(d.dir.path(), asgd().workers(2).shards(9).shard_cut(model::shard_cut::tensors)), "exceeds the model's 6");
  fails(mlp_job(d.dir.path(), allreduce().workers(2).shard_cut(model::shard_cut::even)), "leave --shard-cut out");
  fails(mlp_job(d.dir.path(), sequential_sgd().workers(2)), "need an asynchronous --algorithm");
  fails(mlp_job(d.dir.path(), hogwild().workers(2).shards(2)), "--shards and --push-every do not apply");
  fails(mlp_job(d.dir.path(), asgd().workers(2000)), "--workers: expected an integer in [1, 1024], got 2000");
  fails(mlp_job(d.dir.path(), asgd().workers(2)).gemm(kernels::gemm_backend::own), "--gemm own is the sequential loop's");
  fails(mlp_job(d.dir.path(), asgd().workers(2)).gemm(kernels::gemm_backend::openblas),
        "on actors the kernels choose per product");
  // A worker whose loss diverges stops the run with its reason, not a hang.
  fails(mlp_job(d.dir.path(), asgd().workers(2)).lr(1e6f).epochs(3), "worker");
}

TEST_CASE("an asynchronous run checkpoints the shards' parameters and state, and resumes", "[actors][fit]") {
  larger_data d;
  std::ostringstream log;
  const std::string ckpt = d.dir.file("run.ckpt"), metrics = d.dir.file("run.jsonl");
  job j = mlp_job(d.dir.path(), ddc_asgd().workers(2).shards(2)).momentum(0).threads(2).epochs(1).checkpoint(ckpt)
              .metrics_out(metrics);
  history first = fit(j, log);
  REQUIRE(first.size() == 1);
  {
    // Each shard's version and its rule's state (v, and MS per worker) are in the checkpoint.
    net::checkpoint c = net::load_checkpoint(ckpt);
    CHECK(c.optimizer_kind == "ddc-asgd");
    CHECK(c.epoch == 1);
    REQUIRE(c.shard_versions.size() == 2);
    CHECK(c.shard_versions[0] > 0);
    std::vector<std::string> names;
    for (auto& t : c.optimizer) names.push_back(t.name);
    CHECK(names == std::vector<std::string>{"shard0/ms/0", "shard0/ms/1", "shard0/v", "shard1/ms/0", "shard1/ms/1",
                                            "shard1/v"});
    // The checkpoint evaluates to the accuracy the epoch recorded.
    CHECK(evaluate(j, ckpt, log).test_accuracy == first[0].test_accuracy);
  }
  history second = fit(j.epochs(2), log);
  REQUIRE(second.size() == 1);
  CHECK(second[0].epoch == 2);
  CHECK_THAT(log.str(), Contains("resumed from"));
  CHECK_THAT(log.str(), !Contains("starts fresh"));
  // The resumed run starts from the trained parameters, not from scratch.
  CHECK(second[0].train_loss < first[0].train_loss);
  // Each run appends its epoch's record, then its workers' summary.
  const auto lines = read_lines(metrics);
  REQUIRE(lines.size() == 4);
  CHECK_THAT(lines[0], StartsWith("{\"epoch\":1,"));
  CHECK_THAT(lines[2], StartsWith("{\"epoch\":2,"));
  CHECK_THAT(lines[3], StartsWith("{\"workers_summary\":"));
}

TEST_CASE("shards cut evenly: tensors across shards train, checkpoint whole tensors, and resume", "[actors][fit]") {
  larger_data d;
  std::ostringstream log;
  const std::string ckpt = d.dir.file("even.ckpt");
  job j = mlp_job(d.dir.path(), ddc_asgd().workers(2).shards(3).shard_cut(model::shard_cut::even))
              .momentum(0).threads(2).epochs(1).checkpoint(ckpt);
  history first = fit(j, log);
  REQUIRE(first.size() == 1);
  CHECK(first[0].train_loss < 2.0);
  {
    // The checkpoint holds the model's whole tensors, and each shard's state of its equal range.
    net::checkpoint c = net::load_checkpoint(ckpt);
    REQUIRE(c.shard_versions.size() == 3);
    int64_t total = 0;
    for (const auto& t : c.params) total += t.value.numel();
    int64_t v = 0;
    for (const auto& t : c.optimizer)
      if (t.name.size() > 2 && t.name.substr(t.name.size() - 2) == "/v") v += t.value.numel();
    CHECK(v == total);
    CHECK(evaluate(j, ckpt, log).test_accuracy == first[0].test_accuracy);
  }
  history second = fit(j.epochs(2), log);
  REQUIRE(second.size() == 1);
  CHECK(second[0].epoch == 2);
  CHECK_THAT(log.str(), Contains("shard 2: resumed at version"));
  CHECK_THAT(log.str(), !Contains("starts fresh"));
  CHECK(second[0].train_loss < first[0].train_loss);
  // Resumed on two shards cut by whole tensors: each takes its part of the three shards' state.
  std::ostringstream again;
  history third = fit(j.epochs(3).algorithm(ddc_asgd().workers(2).shards(2)), again);
  REQUIRE(third.size() == 1);
  CHECK_THAT(again.str(), Contains("shard 1: resumed at version"));
  CHECK_THAT(again.str(), Contains("the checkpoint has 3 shard(s), this run 2: its state cut again"));
  CHECK_THAT(again.str(), !Contains("starts fresh"));
}

TEST_CASE("checkpoints between epochs: every N steps, in the loop and on actors", "[train][fit][actors]") {
  larger_data d;  // 32 steps per epoch
  for (algorithm a : {sequential_sgd(), asgd().workers(2)}) {
    const bool actors = a.settings().kind != algorithm_kind::sequential;
    INFO(to_string(a.settings().kind));
    const std::string ckpt = d.dir.file(std::string("every_") + to_string(a.settings().kind) + ".ckpt");
    std::ostringstream log;
    net::checkpoint seen;
    bool found = false;
    job j = mlp_job(d.dir.path(), a).threads(2).epochs(1).evaluate(false).checkpoint(ckpt).checkpoint_every(5);
    j.on_step([&](const step_event& e) {
      if (e.step != 31) return;
      // The epoch is not over: a checkpoint now is a periodic one. On actors the
      // evaluator writes it on its own thread: wait for it (bounded).
      for (int i = 0; i < 1000 && !std::filesystem::exists(ckpt); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (!std::filesystem::exists(ckpt)) return;
      found = true;
      seen = net::load_checkpoint(ckpt);
    });
    fit(j, log);
    REQUIRE(found);
    CHECK(seen.epoch == 0);  // epochs done: not the one in progress
    CHECK(seen.step > 0);
    CHECK(seen.step <= 31);
    CHECK(seen.step % 5 == 0);
    CHECK(seen.epoch_samples == seen.step * 32);  // how far into the epoch: a resumed run trains the rest
    if (!actors) CHECK(seen.step == 30);
  }
}

// Bug (issue 21, item 18): on actors a run resumed from a checkpoint inside an
// epoch started that epoch over in its loaders and counted its samples from 0,
// so the epoch recorded the steps before the checkpoint twice (5 + 32 for an
// epoch of 32).
TEST_CASE("an asynchronous run resumed inside an epoch trains the rest of it: the epoch records its own steps",
          "[actors][fit]") {
  larger_data d;  // 32 steps per epoch
  const std::string ckpt = d.dir.file("mid.ckpt");
  std::ostringstream log;
  const job base = mlp_job(d.dir.path(), asgd()).momentum(0).threads(2).evaluate(false).checkpoint(ckpt);
  const history cut = fit(job(base).max_steps(5), log);
  REQUIRE(cut.size() == 1);
  CHECK(cut[0].steps == 5);
  const net::checkpoint c = net::load_checkpoint(ckpt);
  CHECK(c.epoch == 0);
  CHECK(c.step == 5);
  CHECK(c.epoch_samples == 5 * 32);

  std::vector<int> steps_in(3, 0);  // steps reported per epoch
  job rest = base;
  rest.on_step([&](const step_event& e) { ++steps_in.at(static_cast<std::size_t>(e.epoch)); });
  const history h = fit(rest, log);
  CHECK_THAT(log.str(), Contains("resumed from " + ckpt + " after epoch 0 (5 steps), 160 samples into epoch 1"));
  REQUIRE(h.size() == 2);
  CHECK(h[0].epoch == 1);
  CHECK(h[0].steps == 32);  // 5 before the checkpoint, 27 after
  CHECK(h[1].steps == 64);
  CHECK(steps_in[1] == 27);
  CHECK(steps_in[2] == 32);
  CHECK(net::load_checkpoint(ckpt).epoch_samples == 0);  // whole epochs done
}

TEST_CASE("a GPipe pipeline reproduces the sequential loop's losses for 100 steps", "[actors][fit][pipeline]") {
  larger_data d;  // 32 steps per epoch
  std::ostringstream log;
  std::vector<double> expected, got;
  job seq = mlp_job(d.dir.path()).threads(2).epochs(4).max_steps(100).checkpoint(d.dir.file("seq.ckpt"));
  seq.on_step([&](const step_event& e) { expected.push_back(e.loss); });
  const history hs = fit(seq, log);
  const net::checkpoint cs = net::load_checkpoint(d.dir.file("seq.ckpt"));
  // The third run places its stages by the greedy placer on devices of
  // speeds 1, 2 and 4 (emulated by holding each stage's output): the cuts and
  // the pace change, the arithmetic does not.
  for (auto [stages, placed] : {std::pair{2, false}, std::pair{3, false}, std::pair{3, true}}) {
    INFO(stages << " stages" << (placed ? ", placed on devices of speeds 1, 2, 4" : ""));
    got.clear();
    job pipe = seq;
    pipe.pipeline(stages, 4, pipeline_schedule::gpipe).metrics_out(d.dir.file("pipe.jsonl"));
    if (placed) pipe.placement(placement_kind::greedy, {1, 2, 4});
    const std::string ckpt = d.dir.file("pipe" + std::to_string(stages) + (placed ? "p" : "") + ".ckpt");
    pipe.checkpoint(ckpt);
    pipe.on_step([&](const step_event& e) { got.push_back(e.loss); });
    history h = fit(pipe, log);
    REQUIRE(got.size() == 100);
    for (std::size_t i = 0; i < 100; ++i) {
      INFO("step " << i + 1);
      CHECK(std::abs(got[i] - expected[i]) <= 1e-4);
    }
    // The final snapshot holds every stage after all 100 updates (the first
    // stage's last one included): the sequential loop's parameters.
    const net::checkpoint cp = net::load_checkpoint(ckpt);
    CHECK(cp.step == cs.step);
    REQUIRE(cp.params.size() == cs.params.size());
    for (std::size_t t = 0; t < cs.params.size(); ++t) {
      INFO(cs.params[t].name);
      REQUIRE(cp.params[t].name == cs.params[t].name);
      const float *a = cs.params[t].value.data(), *b = cp.params[t].value.data();
      float worst = 0;
      for (int64_t i = 0; i < cs.params[t].value.numel(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
      CHECK(worst <= 1e-4f);
    }
    CHECK(std::abs(h.back().test_accuracy - hs.back().test_accuracy) <= 0.002);
    CHECK(h.back().test_accuracy > 0.8);
    CHECK_THAT(read_lines(d.dir.file("pipe.jsonl")).back(), Contains("\"pipeline_stages\":" + std::to_string(stages)));
    if (placed) CHECK_THAT(log.str(), Contains("placement greedy, 3 stages"));
  }
}

TEST_CASE("a resumed GPipe pipeline continues as if uninterrupted: each stage's momentum is in the checkpoint",
          "[actors][fit][pipeline]") {
  larger_data d;  // 32 steps per epoch
  std::ostringstream log;
  std::vector<double> straight, resumed;
  job pipe = mlp_job(d.dir.path()).threads(2).pipeline(2, 4, pipeline_schedule::gpipe);  // momentum 0.9
  pipe.on_step([&](const step_event& e) { straight.push_back(e.loss); });
  fit(job(pipe).epochs(2), log);
  REQUIRE(straight.size() == 64);
  const std::string ckpt = d.dir.file("pipe.ckpt");
  job part = job(pipe).checkpoint(ckpt);
  part.on_step([](const step_event&) {});
  fit(job(part).epochs(1), log);
  CHECK(net::load_checkpoint(ckpt).optimizer.size() == 2);  // shard0/velocity, shard1/velocity
  part.on_step([&](const step_event& e) { resumed.push_back(e.loss); });
  std::ostringstream rlog;
  fit(job(part).epochs(2), rlog);
  CHECK_THAT(rlog.str(), Contains("resumed from"));
  CHECK_THAT(rlog.str(), !Contains("state starts at 0"));
  REQUIRE(resumed.size() == 32);
  for (std::size_t i = 0; i < 32; ++i) {
    INFO("step " << 33 + i << ": " << resumed[i] << " against " << straight[32 + i]);
    // Relative: the task is easy and its losses small (a restart of the momentum changes them by a few %).
    CHECK(std::abs(resumed[i] - straight[32 + i]) <= 1e-4 * std::abs(straight[32 + i]) + 1e-7);
  }
}

TEST_CASE("a hybrid of one pipeline replica pushing to its stages' shards reproduces the sequential loop",
          "[actors][fit][pipeline]") {
  larger_data d;  // 32 steps per epoch
  std::ostringstream log;
  std::vector<double> expected, got;
  // ASGD with one worker is SGD without momentum, the shard's lr schedule the loop's.
  job seq = mlp_job(d.dir.path()).momentum(0.0f).threads(2).epochs(4).max_steps(100).checkpoint(d.dir.file("seq.ckpt"));
  seq.on_step([&](const step_event& e) { expected.push_back(e.loss); });
  fit(seq, log);
  const net::checkpoint cs = net::load_checkpoint(d.dir.file("seq.ckpt"));
  // 3 stages of the MLP's 6 layers: one of them (a ReLU alone, or a flatten) may have no parameters and no shard.
  for (int stages : {2, 3}) {
    INFO(stages << " stages");
    job hybrid = seq;
    const std::string ckpt = d.dir.file("hybrid" + std::to_string(stages) + ".ckpt");
    hybrid.algorithm(asgd()).pipeline(stages, 4, pipeline_schedule::gpipe).checkpoint(ckpt);
    got.clear();
    hybrid.on_step([&](const step_event& e) { got.push_back(e.loss); });
    std::ostringstream hlog;
    fit(hybrid, hlog);
    CHECK_THAT(hlog.str(), Contains("1 replica(s) of a pipeline (asgd on"));
    REQUIRE(got.size() == 100);
    for (std::size_t i = 0; i < 100; ++i) {
      INFO("step " << i + 1);
      CHECK(std::abs(got[i] - expected[i]) <= 1e-4);
    }
    // The final snapshot, from the shards, holds every stage's 100 pushes.
    const net::checkpoint cp = net::load_checkpoint(ckpt);
    CHECK(cp.optimizer_kind == "asgd");
    REQUIRE(cp.params.size() == cs.params.size());
    for (std::size_t t = 0; t < cs.params.size(); ++t) {
      INFO(cs.params[t].name);
      const float *a = cs.params[t].value.data(), *b = cp.params[t].value.data();
      float worst = 0;
      for (int64_t i = 0; i < cs.params[t].value.numel(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
      CHECK(worst <= 1e-4f);
    }
  }
}

TEST_CASE("a hybrid with allreduce: one replica is the sequential loop, two train and snapshot", "[actors][fit][pipeline][allreduce]") {
  larger_data d;  // 32 steps per epoch
  const job seq = mlp_job(d.dir.path()).threads(2).epochs(4).max_steps(100);  // with momentum: the stages' own step
  const std::vector<double> expected = testing::losses_of(seq);
  const std::vector<double> got =
      testing::losses_of(job(seq).algorithm(allreduce()).pipeline(2, 4, pipeline_schedule::gpipe));
  REQUIRE(got.size() == 100);
  testing::check_same_losses(got, expected, 1e-4, false);
  // Two replicas: stage k of each sums its gradient with the other's before every update.
  std::ostringstream hlog;
  job two = mlp_job(d.dir.path(), allreduce().workers(2)).threads(2).epochs(2).checkpoint(d.dir.file("two.ckpt"));
  two.pipeline(2, 4, pipeline_schedule::gpipe);
  history h = fit(two, hlog);
  CHECK_THAT(hlog.str(), Contains("2 replica(s) of a pipeline (stage k of each allreduces"));
  REQUIRE(h.size() == 2);
  CHECK(h.back().test_accuracy > 0.8);
  const net::checkpoint c = net::load_checkpoint(d.dir.file("two.ckpt"));
  CHECK(c.epoch == 2u);
}

TEST_CASE("a hybrid with allreduce on 1F1B: one replica is the 1F1B pipeline, two train with the same parameters",
          "[actors][fit][pipeline][allreduce]") {
  larger_data d;  // 32 steps per epoch
  // The pipeline alone (sequential algorithm, each stage its own update per micro-batch).
  const job alone = mlp_job(d.dir.path()).threads(2).epochs(2).max_steps(48).pipeline(2, 4, pipeline_schedule::one_f_one_b);
  const std::vector<double> expected = testing::losses_of(alone);
  REQUIRE(expected.size() == 48);
  testing::check_same_losses(testing::losses_of(job(alone).algorithm(allreduce())), expected, 1e-4, false);
  // Two replicas: stage k of each averages every micro-batch's gradient with the other's before its update.
  std::ostringstream hlog;
  job two = mlp_job(d.dir.path(), allreduce().workers(2)).threads(2).epochs(2).checkpoint(d.dir.file("two.ckpt"));
  two.pipeline(2, 4, pipeline_schedule::one_f_one_b);
  history h = fit(two, hlog);
  REQUIRE(h.size() == 2);
  CHECK(h.back().test_accuracy > 0.8);
  CHECK(h.back().train_loss < h.front().train_loss);
  CHECK(net::load_checkpoint(d.dir.file("two.ckpt")).epoch == 2u);
}

TEST_CASE("a hybrid: replicas of a GPipe pipeline train with DDC-ASGD and SSGD on their stages' shards",
          "[actors][fit][pipeline]") {
  larger_data d;
  for (algorithm a : {ddc_asgd().workers(3), ssgd().workers(2)}) {
    const std::string name = to_string(a.settings().kind);
    INFO(name);
    std::ostringstream log;
    job j = mlp_job(d.dir.path(), a).momentum(0).threads(2).pipeline(2, 4).metrics_out(d.dir.file(name + ".jsonl"));
    history h = fit(j, log);
    REQUIRE(h.size() == 2);
    CHECK(h.back().test_accuracy > 0.8);
    const int replicas = a.settings().workers;
    CHECK_THAT(log.str(), Contains(std::to_string(replicas) + " replica(s) of a pipeline (" + name + " on 2 shard(s)"));
    // Each replica trains on its own part of the data; the staleness is its last stage's pushes'.
    const auto lines = read_lines(j.config().metrics_out);
    REQUIRE(lines.size() == 3);
    const auto w = nlohmann::json::parse(lines[2])["workers_summary"];
    REQUIRE(static_cast<int>(w.size()) == replicas);
    // Replicas take batches as fast as they go (an epoch is every replica's samples together): each takes
    // some, all of them at least 2 epochs' worth of batches of 32.
    int total = 0;
    for (const auto& x : w) {
      CHECK(x["updates"].get<int>() >= 5);
      total += x["updates"].get<int>();
    }
    CHECK(total >= 2 * 1024 / 32);
    if (name == "ssgd") CHECK(h.back().mean_staleness == 0.0);
    else CHECK(h.back().max_staleness >= 1);
  }
}

TEST_CASE("a hybrid resumes from its checkpoint: the stages start from their shards' parameters and versions",
          "[actors][fit][pipeline]") {
  larger_data d;
  std::ostringstream log;
  job j = mlp_job(d.dir.path(), ddc_asgd().workers(2)).momentum(0).threads(2).pipeline(2, 4).epochs(1)
              .checkpoint(d.dir.file("hybrid.ckpt"));
  const history first = fit(j, log);
  const history second = fit(j.epochs(2), log);
  REQUIRE(second.size() == 1);
  CHECK_THAT(log.str(), Contains("resumed from"));
  CHECK(second[0].train_loss < first[0].train_loss);
  // A stage that kept version 0 after the resume would push its first gradient at least 32 versions stale (the
  // first epoch's updates); 2 replicas are a few apart at times (up to 8 seen; more on a loaded machine).
  // The core-level test checks the first push's staleness exactly.
  CHECK(second[0].max_staleness < 32);
}

TEST_CASE("a 1F1B pipeline with weight stashing trains, and writes a timeline", "[actors][fit][pipeline]") {
  larger_data d;
  std::ostringstream log;
  const std::string trace = d.dir.file("trace.json");
  job j = mlp_job(d.dir.path()).threads(2).epochs(2).pipeline(3, 4, pipeline_schedule::one_f_one_b).trace(trace);
  history h = fit(j, log);
  REQUIRE(h.size() == 2);
  CHECK(h.back().test_accuracy > 0.8);
  CHECK_THAT(log.str(), Contains("a pipeline of 3 stages (1f1b, 4 micro-batches"));
  std::ifstream f(trace);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  CHECK_THAT(text, Contains("\"traceEvents\""));
  CHECK_THAT(text, Contains("\"name\":\"forward\""));
  CHECK_THAT(text, Contains("\"name\":\"backward\""));
  CHECK_THAT(text, Contains("stage 2 on node 0"));
  CHECK_THAT(text, Contains("\"micro_batch\":"));
}

TEST_CASE("pipeline options are checked", "[train][fit][pipeline]") {
  larger_data d;
  std::ostringstream log;
  // A hybrid: GPipe, shards and pushes that follow the stages, devices slowed instead of workers.
  CHECK_THROWS_MATCHES(fit(mlp_job(d.dir.path(), asgd().workers(2)).pipeline(2, 4, pipeline_schedule::one_f_one_b), log),
                       troupe::error, message(Contains("a hybrid on shards runs --schedule gpipe")));
  CHECK_THROWS_MATCHES(fit(mlp_job(d.dir.path(), hogwild().workers(2)).pipeline(2), log), troupe::error,
                       message(Contains("a hybrid's stages push to parameter shards")));
  CHECK_THROWS_MATCHES(fit(mlp_job(d.dir.path(), asgd().workers(2).shards(2)).pipeline(2), log), troupe::error,
                       message(Contains("the shards follow the stages")));
  CHECK_THROWS_MATCHES(fit(mlp_job(d.dir.path(), asgd().workers(2).shard_cut(model::shard_cut::even)).pipeline(2), log),
                       troupe::error, message(Contains("leave --shards and --shard-cut out")));
  CHECK_THROWS_MATCHES(fit(mlp_job(d.dir.path(), asgd().workers(2).worker_speeds({2, 1})).pipeline(2), log), troupe::error,
                       message(Contains("--device-speeds")));
  CHECK_THROWS_MATCHES(fit(mlp_job(d.dir.path()).pipeline(2, 64), log), troupe::error,
                       message(Contains("--micro-batches 64 exceeds --batch-size 32")));
  CHECK_THROWS_MATCHES(fit(mlp_job(d.dir.path()).pipeline(9), log), troupe::error,
                       message(Contains("--pipeline-stages 9 exceeds the 6 items")));
}
