#include "train/data_source.hpp"

#include <memory>

#include "tensor/error.hpp"

namespace troupe::data {

train_test source::load() const {
  if (!load_) throw error("the job has no data: give it one with job.data(...), e.g. troupe::data::fashion_mnist()");
  return load_();
}

source idx_dir(const std::string& dir) {
  return source([dir] { return load_mnist_dir(dir); }, "IDX files in " + dir);
}

source fashion_mnist() { return idx_dir(default_fashion_mnist_dir()); }

source cifar10_dir(const std::string& dir) {
  return source([dir] { return load_cifar10_dir(dir); }, "CIFAR-10 files in " + dir);
}

source in_memory(image_dataset train, image_dataset test, std::string description) {
  auto sets = std::make_shared<const train_test>(train_test{std::move(train), std::move(test)});
  return source([sets] { return *sets; }, std::move(description));
}

source in_memory(const tensor& train_x, const std::vector<int32_t>& train_labels, const tensor& test_x,
                 const std::vector<int32_t>& test_labels, int num_classes) {
  return in_memory(from_tensors(train_x, train_labels, num_classes), from_tensors(test_x, test_labels, num_classes),
                   "in-memory data");
}

} // namespace troupe::data
