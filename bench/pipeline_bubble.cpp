// pipeline_bubble: K equal synthetic stages (a layer that takes a fixed time
// in forward and in backward, plus a bias so that every stage has parameters
// and a backward), trained through the public API with --trace; the pipeline
// bubble is then read from the trace by bench/trace_stats.py.
//
//   pipeline_bubble --stages 4 --micro-batches 16 --schedule gpipe --steps 4
//                   --op-ms 10 --trace /tmp/bubble.json
//
// --wait sleep (default) waits without a core: K stages overlap even where
// the machine has fewer cores than stages. --wait spin keeps a core busy, as
// real compute does, and needs a core per stage.
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <troupe/troupe.hpp>

namespace {

using namespace troupe;
using clock_type = std::chrono::steady_clock;

void take_time(std::chrono::microseconds d, bool spin) {
  if (!spin) {
    std::this_thread::sleep_for(d);
    return;
  }
  const auto until = clock_type::now() + d;
  while (clock_type::now() < until) {
  }
}

/// y = x + b, taking `op` in forward and in backward.
class synthetic_layer final : public model::layer {
public:
  synthetic_layer(std::chrono::microseconds op, bool spin) : op_(op), spin_(spin) {}
  std::string kind() const override { return "synthetic"; }
  std::string describe() const override {
    return "synthetic(" + std::to_string(op_.count()) + " us forward and backward, " + (spin_ ? "spin" : "sleep") + ")";
  }
  shape infer(const shape& in, const std::string&) override {
    in_ = in;
    return in;
  }
  void initialize(std::mt19937_64&) override { b_.value = tensor::zeros(in_); }
  const tensor& forward(const kernels::context&, const tensor& x, bool, model::layer_state& s) override {
    take_time(op_, spin_);
    tensor& y_ = s.y;
    if (y_.shape() != x.shape()) y_ = tensor::empty(x.shape());
    const int64_t n = x.shape()[0], d = in_.numel();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < d; ++j) y_.data()[i * d + j] = x.data()[i * d + j] + std::as_const(b_.value).data()[j];
    return y_;
  }
  const tensor& backward(const kernels::context&, const tensor& dy, model::layer_state& s) override {
    take_time(op_, spin_);
    tensor& dx_ = s.dx;
    const int64_t n = dy.shape()[0], d = in_.numel();
    if (b_.grad.shape() != in_) b_.grad = tensor::empty(in_);
    for (int64_t j = 0; j < d; ++j) {
      float s = 0;
      for (int64_t i = 0; i < n; ++i) s += dy.data()[i * d + j];
      b_.grad.data()[j] = s;
    }
    if (dx_.shape() != dy.shape()) dx_ = tensor::empty(dy.shape());
    dx_.copy_from(dy);  // identity in x
    return dx_;
  }
  std::vector<model::parameter*> parameters() override { return {&b_}; }

private:
  std::chrono::microseconds op_;
  bool spin_;
  shape in_;
  model::parameter b_{"bias", {}, {}};
};

/// n random samples of `features` values, labels in [0, 2).
std::pair<tensor, std::vector<int32_t>> noise(int n, int features, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  tensor x = tensor::empty({n, features});
  std::vector<int32_t> y(n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < features; ++j) x.at(i * features + j) = d(rng);
    y[i] = static_cast<int32_t>(rng() % 2);
  }
  return {x, y};
}

int usage(const char* why) {
  std::cerr << "pipeline_bubble: " << why
            << "\nusage: pipeline_bubble [--stages K] [--micro-batches M] [--schedule gpipe|1f1b] [--steps S]"
               " [--op-ms T] [--wait sleep|spin] [--trace FILE]\n";
  return 2;
}

} // namespace

int main(int argc, char** argv) {
  int stages = 2, micro_batches = 8, steps = 4;
  double op_ms = 10;
  bool spin = false;
  std::string schedule = "gpipe", trace = "pipeline_bubble.json";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage(("missing value after " + a).c_str());
    const std::string v = argv[++i];
    if (a == "--stages") stages = std::atoi(v.c_str());
    else if (a == "--micro-batches") micro_batches = std::atoi(v.c_str());
    else if (a == "--schedule") schedule = v;
    else if (a == "--steps") steps = std::atoi(v.c_str());
    else if (a == "--op-ms") op_ms = std::atof(v.c_str());
    else if (a == "--wait") spin = v == "spin";
    else if (a == "--trace") trace = v;
    else return usage(("unknown option " + a).c_str());
  }
  if (stages < 2 || micro_batches < 1 || steps < 1 || op_ms <= 0) return usage("bad value");
  constexpr int features = 16;
  const auto op = std::chrono::microseconds(static_cast<int64_t>(op_ms * 1000));
  const int64_t batch = 2 * micro_batches;  // two samples per micro-batch
  auto [x, y] = noise(static_cast<int>(batch * steps), features, 1);
  auto [tx, ty] = noise(static_cast<int>(batch), features, 2);

  settings s;
  s.epochs = 1;
  s.batch_size = batch;
  s.lr = 0.01f;
  s.threads = stages + 1;  // a scheduler thread per stage (and the loader): waits overlap
  s.evaluate = false;
  s.progress = progress_mode::none;
  s.trace = trace;
  s.pipeline.stages = stages;
  s.pipeline.micro_batches = micro_batches;
  s.pipeline.schedule = schedule == "1f1b" ? pipeline_schedule::one_f_one_b : pipeline_schedule::gpipe;
  for (int k = 1; k < stages; ++k) s.pipeline.cuts.push_back(k);  // one synthetic layer per stage
  auto j = job()
               .model([stages, op, spin] {
                 std::vector<std::unique_ptr<model::layer>> layers;
                 for (int k = 0; k < stages; ++k) layers.push_back(std::make_unique<synthetic_layer>(op, spin));
                 // the last stage's loss needs two logits: a dense layer, next to its synthetic one
                 layers.push_back(nn::dense(features, 2).make());
                 return model::model(std::move(layers));
               }, "synthetic")
               .data(data::in_memory(x, y, tx, ty, 2))
               .configure(s);
  try {
    fit(j);
  } catch (const std::exception& e) {
    std::cerr << "pipeline_bubble: " << e.what() << "\n";
    return 1;
  }
  std::cout << "stages " << stages << ", micro-batches " << micro_batches << ", schedule " << schedule
            << ", steps " << steps << ", op " << op_ms << " ms (" << (spin ? "spin" : "sleep") << "): trace in "
            << trace << "\n";
  return 0;
}
