// custom_model: a model you define yourself, trained with DDC-ASGD on 4
// workers through the public API: the shortest path from a model to a run.
//   custom_model              5 epochs on Fashion-MNIST
//   custom_model 200          stop after 200 updates (a quick look)
#include <cstdlib>
#include <iostream>

#include <troupe/troupe.hpp>

int main(int argc, char** argv) {
  using namespace troupe;
  using namespace troupe::nn;
  const long max_steps = argc > 1 ? std::atol(argv[1]) : 0;

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
