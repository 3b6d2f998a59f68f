// A language model through troupe::fit in the sequential loop: windows of a
// small text, token-level loss, the records' losses, the vocabulary in the
// checkpoint, generation from it, and the errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "actors/fit.hpp"
#include "model/zoo.hpp"
#include "net/checkpoint.hpp"
#include "tests/test_util.hpp"
#include "train/generate.hpp"
#include "train/job_file.hpp"
#include "train/metrics.hpp"

using namespace troupe;
using Catch::Matchers::Contains;
using testing::message;
using testing::small_text;

namespace {

std::string write_text(const testing::temp_dir& dir, const std::string& text) {
  const std::string path = dir.path() + "/corpus.txt";
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

/// A tiny gpt (32 features, 2 heads, 1 block) on windows of 16 tokens.
job tiny_lm_job(data::source text) {
  return job()
      .model([](int64_t vocab) { return zoo::gpt(vocab, 16, 32, 2, 1); }, "tiny-gpt")
      .data(std::move(text))
      .optimizer(optimizer_kind::adamw)
      .lr(3e-3f)
      .batch_size(16)
      .epochs(3)
      .seed(5)
      .threads(1)
      .progress(progress_mode::none);
}

/// The trainer's gpt on windows of 16 tokens of a small text in `dir`: `steps` steps, one thread, saved to
/// dir + `checkpoint`.
train::job_spec trainer_spec(const testing::temp_dir& dir, int64_t steps, const std::string& checkpoint) {
  train::job_spec spec = train::defaults_for("gpt");
  spec.data_dir = write_text(dir, small_text());
  spec.context = 16;
  spec.train.max_steps = steps;
  spec.train.epochs = 1;
  spec.train.evaluate = false;
  spec.train.threads = 1;
  spec.train.progress = progress_mode::none;
  spec.train.checkpoint = dir.path() + checkpoint;
  return spec;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

} // namespace

TEST_CASE("a tiny gpt trains through fit on a small text and its loss falls", "[lm]") {
  testing::temp_dir dir("troupe_lm");
  std::vector<double> losses;
  job j = tiny_lm_job(data::text(small_text(), 16, 256));
  j.validation_fraction(0.1).metrics_out(dir.path() + "/m.jsonl").on_step([&](const step_event& e) {
    losses.push_back(e.loss);
  });
  std::ostringstream log;
  const history h = fit(j, log);
  REQUIRE(h.size() == 3);
  REQUIRE(losses.size() == 48);  // 3 epochs of 256 windows in batches of 16
  CHECK(losses.front() > 2.5);   // about ln 27 at the start
  CHECK(h.back().train_loss < 0.6 * losses.front());
  CHECK(h.back().test_loss < h.front().test_loss);
  for (const epoch_metrics& m : h) {
    CHECK(m.test_loss > 0);
    CHECK(m.validation_loss > 0);
    CHECK(m.perplexity == Approx(std::exp(m.test_loss)));
    CHECK(m.bits_per_char == Approx(m.test_loss / std::log(2.0)));
    CHECK(m.test_accuracy >= 0);
    CHECK(m.test_accuracy <= 1);
  }
  CHECK_THAT(log.str(), Contains("bits/char"));
  CHECK_THAT(log.str(), Contains(" tokens/s)"));
  const std::string records = read_all(dir.path() + "/m.jsonl");
  for (const char* field : {"\"test_loss\":", "\"validation_loss\":", "\"perplexity\":", "\"bits_per_char\":",
                            "\"test_accuracy\":", "\"tokens_per_s\":"})
    CHECK_THAT(records, Contains(field));
}

TEST_CASE("an image model's record holds none of a language model's fields", "[lm]") {
  epoch_metrics m;
  m.test_accuracy = 0.5;
  m.test_loss = 1.0;
  train::run_info r;
  const std::string image = train::to_json(m, r);
  for (const char* field : {"test_loss", "validation_loss", "perplexity", "bits_per_char", "tokens_per_s"})
    CHECK_THAT(image, !Contains(field));
  CHECK_THAT(train::describe(m, r), !Contains("tokens/s"));
  r.language_model = true;
  r.tokens_per_sample = 16;
  m.samples_per_s = 100;
  CHECK_THAT(train::to_json(m, r), Contains("\"test_loss\":1.0"));
  CHECK_THAT(train::to_json(m, r), Contains("\"samples_per_s\":100.0,\"tokens_per_s\":1600.0"));
  CHECK_THAT(train::describe(m, r), Contains("100 samples/s (1600 tokens/s)"));
}

TEST_CASE("the checkpoint keeps the vocabulary and generation from it is deterministic", "[lm]") {
  testing::temp_dir dir("troupe_lm");
  const train::job_spec spec = trainer_spec(dir, 3, "/gpt.ckpt");
  std::ostringstream log;
  fit(train::make_job(spec), log);
  const net::checkpoint c = net::load_checkpoint(spec.train.checkpoint);
  CHECK(c.vocabulary == " .abcdefghijklmnopqrstuvwxyz");

  generate_options o;
  o.prompt = "the ";
  o.tokens = 40;
  o.temperature = 0.8f;
  o.top_k = 5;
  o.seed = 11;
  const std::string a = generate(spec.train.checkpoint, o);
  CHECK(a.size() == 40);
  CHECK(generate(spec.train.checkpoint, o) == a);
  for (char ch : a) CHECK(c.vocabulary.find(ch) != std::string::npos);
  o.temperature = 0;  // greedy: no draw at all
  CHECK(generate(spec.train.checkpoint, o) == generate(spec.train.checkpoint, o));
  o.prompt = "THE";
  CHECK_THROWS_MATCHES(generate(spec.train.checkpoint, o), error, message(Contains("not in the vocabulary")));
}

TEST_CASE("a language model's errors are clear", "[lm]") {
  std::ostringstream log;
  SECTION("a missing corpus") {
    CHECK_THROWS_MATCHES(fit(tiny_lm_job(data::text_file("/nonexistent/corpus.txt", 16)), log), error,
                         message(Contains("/nonexistent/corpus.txt does not exist")));
  }
  SECTION("a corpus shorter than one window") {
    CHECK_THROWS_MATCHES(fit(tiny_lm_job(data::text(std::string(100, 'a') + "b", 16)), log), error,
                         message(Contains("shorter than one window")));
  }
  SECTION("adamw for a language model on actors") {
    job j = tiny_lm_job(data::text(small_text(), 16));
    CHECK_THROWS_MATCHES(fit(j.algorithm(dc_asgd_a().workers(2)), log), error,
                         message(Contains("--optimizer adamw is the sequential loop's")));
  }
  SECTION("a model made for a vocabulary on images") {
    job j = tiny_lm_job(data::fashion_mnist());
    CHECK_THROWS_MATCHES(fit(j, log), error, message(Contains("its data must be text")));
  }
  SECTION("adamw on actors") {
    job j = job().model([] { return zoo::mlp(); }).data(data::fashion_mnist()).optimizer(optimizer_kind::adamw);
    CHECK_THROWS_MATCHES(fit(j.algorithm(ssgd().workers(2)), log), error,
                         message(Contains("shards': with --algorithm ssgd the algorithm's update rule applies")));
  }
}

TEST_CASE("a language model resumes from its checkpoint and refuses one of another vocabulary", "[lm]") {
  testing::temp_dir dir("troupe_lm");
  const std::string ckpt = dir.path() + "/lm.ckpt";
  std::ostringstream log;
  job j = tiny_lm_job(data::text(small_text(), 16, 64));
  REQUIRE(fit(j.epochs(1).checkpoint(ckpt), log).size() == 1);
  const history h = fit(j.epochs(2), log);
  REQUIRE(h.size() == 1);
  CHECK(h[0].epoch == 2);
  CHECK(h[0].steps == 8);
  CHECK(net::load_checkpoint(ckpt).optimizer_kind.rfind("adamw", 0) == 0);
  job other = tiny_lm_job(data::text(small_text() + "XYZ", 16, 64));
  CHECK_THROWS_MATCHES(fit(other.epochs(3).checkpoint(ckpt), log), error,
                       message(Contains("that is not this corpus's")));
}

namespace {
/// The checkpoint of tiny_lm_job on the small text (context 16) after one epoch, in `dir`.
std::string tiny_lm_checkpoint(const testing::temp_dir& dir) {
  const std::string ckpt = dir.path() + "/tiny.ckpt";
  std::ostringstream log;
  job j = tiny_lm_job(data::text(small_text(), 16, 64));
  REQUIRE(fit(j.epochs(1).checkpoint(ckpt), log).size() == 1);
  return ckpt;
}
} // namespace

TEST_CASE("generation with the attention's keys and values kept gives the text of whole forward passes", "[lm]") {
  testing::temp_dir dir("troupe_lm");
  const std::string ckpt = tiny_lm_checkpoint(dir);
  generate_options o;
  o.prompt = "the ";
  o.tokens = 60;  // past the context of 16: the window moves on
  for (const float temperature : {0.0f, 1.0f})
    for (const int64_t shift : {1, 5, 16}) {
      INFO("temperature " << temperature << ", window shift " << shift);
      o.temperature = temperature;
      o.window_shift = shift;
      o.cache = true;
      const std::string cached = generate(ckpt, o);
      o.cache = false;
      CHECK(generate(ckpt, o) == cached);
      CHECK(cached.size() == 60);
    }
  // Each token's text as it is drawn: the returned text, piece by piece.
  std::string streamed;
  int64_t pieces = 0;
  o.on_token = [&](const std::string& piece) {
    streamed += piece;
    ++pieces;
  };
  CHECK(generate(ckpt, o) == streamed);
  CHECK(pieces == 60);
  o.on_token = nullptr;
  // Weights that are not finite give no text but an error that says so.
  {
    net::checkpoint bad = net::load_checkpoint(ckpt);
    bad.params.back().value.data()[0] = std::nanf("");
    const std::string nan_ckpt = dir.path() + "/nan.ckpt";
    net::save_checkpoint(nan_ckpt, bad);
    CHECK_THROWS_MATCHES(generate(nan_ckpt, o), error,
                         message(Contains("logits for token 1 are not finite (NaN or infinite)")));
  }
  // Nucleus sampling: a tiny top_p keeps the likeliest token only, top_p 1 all of them.
  o.window_shift = 1;
  o.temperature = 0;
  const std::string likeliest = generate(ckpt, o);
  o.temperature = 1;
  o.top_p = 1e-6f;
  CHECK(generate(ckpt, o) == likeliest);
  o.top_p = 1;
  const std::string all = generate(ckpt, o);
  o.top_p = 0.9f;
  const std::string nucleus = generate(ckpt, o);
  CHECK(nucleus.size() == 60);
  for (const float bad : {0.0f, 1.5f, std::nanf("")}) {
    o.top_p = bad;
    CHECK_THROWS_MATCHES(generate(ckpt, o), error, message(Contains("top-p must be in (0, 1]")));
  }
  o.top_p = 1;
  CHECK(generate(ckpt, o) == all);
  o.threads = 0;  // every CPU this process may use: the same text
  CHECK(generate(ckpt, o) == all);
  o.threads = -1;
  CHECK_THROWS_MATCHES(generate(ckpt, o), error, message(Contains("threads must be >= 0")));
  o.threads = 1;
  o.window_shift = 17;
  CHECK_THROWS_MATCHES(generate(ckpt, o), error, message(Contains("window-shift must be in [1, 16]")));
  o.window_shift = 0;
  CHECK_THROWS_MATCHES(generate(ckpt, o), error, message(Contains("window-shift must be in [1, 16]")));
}

TEST_CASE("generation reads the gpt's size from the checkpoint, and a description its tensors cannot hold is refused",
          "[lm]") {
  testing::temp_dir dir("troupe_lm");
  // A library user's size (32 features, 2 heads, 1 block), not the trainer's default.
  const std::string ckpt = tiny_lm_checkpoint(dir);
  std::ostringstream log;
  generate_options o;
  o.prompt = "the ";
  o.tokens = 20;
  o.temperature = 0;
  const std::string text = generate(ckpt, o);
  CHECK(text.size() == 20);
  // The same model built by hand from the checkpoint generates the same text.
  net::checkpoint c = net::load_checkpoint(ckpt);
  model::model net = zoo::gpt(static_cast<int64_t>(c.vocabulary.size()), 16, 32, 2, 1);
  net.build({16}, 1);
  net.load_state(c.architecture, c.params);
  CHECK(generate(net, c.vocabulary, o) == text);
  // The trainer's keys give the same sizes: --dim, --heads, --blocks, --mlp-ratio.
  train::job_spec spec = trainer_spec(dir, 1, "/trainer.ckpt");
  spec.dim = 32;
  spec.heads = 2;
  spec.blocks = 1;
  spec.mlp_ratio = 2;
  fit(train::make_job(spec), log);
  CHECK_THAT(net::load_checkpoint(spec.train.checkpoint).architecture,
             Contains("positional_embedding(16 x 32) | transformer_block(32, 2 heads, mlp x2) | layer_norm(32)"));
  CHECK(generate(spec.train.checkpoint, o).size() == 20);
  // An architecture larger than the stored tensors is refused before it is built.
  const std::string lying = dir.path() + "/lying.ckpt";
  c.architecture.replace(c.architecture.find("(16 x 32)"), 9, "(16 x 99999999)");
  net::save_checkpoint(lying, c);
  CHECK_THROWS_MATCHES(generate(lying, o), error, message(Contains("is larger than its")));
  c = net::load_checkpoint(ckpt);  // a ratio whose MLP would overflow 64-bit products of the sizes
  c.architecture.replace(c.architecture.find("mlp x4"), 6, "mlp x999999999");
  net::save_checkpoint(lying, c);
  CHECK_THROWS_MATCHES(generate(lying, o), error, message(Contains("is larger than its")));
  spec.heads = 3;
  CHECK_THROWS_MATCHES(train::make_job(spec), error, message(Contains("--heads 3 does not divide --dim 32")));
}
