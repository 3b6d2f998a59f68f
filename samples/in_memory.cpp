// in_memory: training on data a program already holds, with no files: a
// synthetic task generated here (two interleaved spirals), an MLP, a
// callback that prints the loss every 100 steps and stops early once the
// test accuracy reaches 99 %.
//   in_memory                 up to 40 epochs
//   in_memory 300             stop after 300 steps
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <random>
#include <vector>

#include <troupe/troupe.hpp>

namespace {

/// `n` points on two spirals in the plane, with a little noise; label = which spiral.
std::pair<troupe::tensor, std::vector<int32_t>> spirals(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 0.05f);
  std::uniform_real_distribution<float> t(0.25f, 3.0f * 3.14159265f);
  troupe::tensor x = troupe::tensor::empty({n, 2});
  std::vector<int32_t> y(n);
  for (int i = 0; i < n; ++i) {
    y[i] = i % 2;
    const float a = t(rng), r = a / (3.0f * 3.14159265f), sign = y[i] ? -1.0f : 1.0f;
    x.at(2 * i) = sign * r * std::cos(a) + noise(rng);
    x.at(2 * i + 1) = sign * r * std::sin(a) + noise(rng);
  }
  return {x, y};
}

const char* const usage_text =
    "usage: in_memory [MAX_STEPS]\n"
    "Trains an MLP on data this program generates (two interleaved spirals), with\n"
    "no files: up to 40 epochs, stopping once the test accuracy reaches 99 %, or\n"
    "after MAX_STEPS steps; prints the loss every 100 steps.\n"
    "\n"
    "options:\n"
    "  -h, --help                print this text and exit\n"
    "  --version                 print \"in_memory VERSION\" and exit\n";

} // namespace

int main(int argc, char** argv) {
  using namespace troupe;
  if (train::help_or_version(argc, argv, usage_text, std::cout)) return 0;
  char* end = nullptr;
  const long max_steps = argc > 1 ? std::strtol(argv[1], &end, 10) : 0;
  if (argc > 2 || (argc > 1 && (*end != '\0' || max_steps < 0 || argv[1][0] == '\0'))) {
    std::cerr << "in_memory: expected MAX_STEPS, an integer >= 0, got '" << (argc > 1 ? argv[argc - 1] : "")
              << "'\n" << usage_text;
    return 2;
  }
  auto [train_x, train_y] = spirals(4000, 1);
  auto [test_x, test_y] = spirals(1000, 2);

  auto j = job()
               .model([] { return nn::sequential(nn::dense(2, 64), nn::relu(), nn::dense(64, 64), nn::relu(),
                                                 nn::dense(64, 2)); }, "spiral-mlp")
               .data(data::in_memory(train_x, train_y, test_x, test_y, /*num_classes=*/2))
               .epochs(40)
               .batch_size(32)
               .lr(0.05f)
               .max_steps(max_steps)
               .progress(progress_mode::none)
               .on_step([](const step_event& e) {
                 if (e.step % 100 == 0) std::cout << "step " << e.step << ": loss " << e.loss << "\n";
               })
               .on_epoch([](const epoch_event& e) {
                 if (e.test_accuracy >= 0.99) e.stop();  // good enough: stop early
               });
  try {
    history h = fit(j);
    std::cout << "trained " << h.size() << " epoch(s), test accuracy " << h.back().test_accuracy << "\n";
  } catch (const std::exception& e) {
    std::cerr << "in_memory: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
