// Trains a model this program defines, on data it makes, with DDC-ASGD on 2
// workers, through the installed troupe package.
#include <iostream>
#include <random>

#include <troupe/troupe.hpp>

int main() {
  using namespace troupe;
  // Class k: points around (k, -k) in 4 dimensions.
  auto make = [](int n, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> noise(0.0f, 0.3f);
    tensor x = tensor::empty({n, 4});
    std::vector<int32_t> y(n);
    for (int i = 0; i < n; ++i) {
      y[i] = i % 3;
      for (int k = 0; k < 4; ++k) x.at(4 * i + k) = (k % 2 ? -1.0f : 1.0f) * y[i] + noise(rng);
    }
    return std::make_pair(x, y);
  };
  auto [train_x, train_y] = make(600, 1);
  auto [test_x, test_y] = make(150, 2);
  auto j = job()
               .model([] { return nn::sequential(nn::dense(4, 16), nn::relu(), nn::dense(16, 3)); }, "consumer")
               .data(data::in_memory(train_x, train_y, test_x, test_y, 3))
               .algorithm(ddc_asgd().workers(2))
               .epochs(3)
               .batch_size(16)
               .lr(0.05f)
               .threads(2)
               .progress(progress_mode::none);
  try {
    history h = fit(j, std::cerr);
    std::cout << "consumer: test accuracy " << h.back().test_accuracy << "\n";
    return h.back().test_accuracy > 0.9 ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "consumer: " << e.what() << "\n";
    return 1;
  }
}
