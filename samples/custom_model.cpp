// custom_model: a model you define yourself, trained with DDC-ASGD on 4
// workers through the public API: the shortest path from a model to a run.
//   custom_model              5 epochs on Fashion-MNIST
//   custom_model 200          stop after 200 updates (a quick look)
#include <cstdlib>
#include <iostream>
#include <string>

#include <troupe/troupe.hpp>

namespace {

const char* const usage_text =
    "usage: custom_model [MAX_STEPS]\n"
    "Trains a small CNN defined in this program with DDC-ASGD on 4 workers, on\n"
    "Fashion-MNIST: 5 epochs, or MAX_STEPS updates (a quick look).\n"
    "\n"
    "options:\n"
    "  -h, --help                print this text and exit\n"
    "  --version                 print \"custom_model VERSION\" and exit\n";

} // namespace

int main(int argc, char** argv) {
  using namespace troupe;
  using namespace troupe::nn;
  if (train::help_or_version(argc, argv, usage_text, std::cout)) return 0;
  char* end = nullptr;
  const long max_steps = argc > 1 ? std::strtol(argv[1], &end, 10) : 0;
  if (argc > 2 || (argc > 1 && (*end != '\0' || max_steps < 0 || argv[1][0] == '\0'))) {
    std::cerr << "custom_model: expected MAX_STEPS, an integer >= 0, got '" << (argc > 1 ? argv[argc - 1] : "")
              << "'\n" << usage_text;
    return 2;
  }

  auto j = job()
               .model([] {
                 return sequential(conv2d(1, 16, 5).padding(2), relu(), max_pool2d(2),  // 16 x 14 x 14
                                   flatten(), dense(16 * 14 * 14, 64), relu(), dense(64, 10));
               }, "small-cnn")
               .data(data::fashion_mnist())
               .algorithm(ddc_asgd().workers(4))
               .epochs(5)
               .max_steps(max_steps);
  try {
    history h = fit(j);
    std::cout << "final test accuracy " << h.back().test_accuracy << "\n";
  } catch (const std::exception& e) {
    std::cerr << "custom_model: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
