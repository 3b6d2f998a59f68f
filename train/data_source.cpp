#include "train/data_source.hpp"

#include <memory>

#include "tensor/error.hpp"

namespace troupe::data {

train_test source::load() const {
  if (!load_) throw error("the job has no data: give it one with job.data(...), e.g. troupe::data::fashion_mnist()");
  if (load_text_) throw error("the job's data is text (" + description_ + "): a language model's, read with load_text()");
  return load_();
}

text_corpus source::load_text() const {
  if (!load_text_) throw error("the job's data (" + description_ + ") is not text: a language model needs text data, e.g. troupe::data::text_file(path)");
  return load_text_();
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

namespace {

text_windows checked_windows(int64_t context, int64_t windows_per_epoch) {
  if (context < 1) throw error("text data: the context must be at least 1 token, got " + std::to_string(context));
  if (windows_per_epoch < 1)
    throw error("text data: an epoch must hold at least 1 window, got " + std::to_string(windows_per_epoch));
  return {context, windows_per_epoch};
}

} // namespace

source text_file(const std::string& path, int64_t context, int64_t windows_per_epoch) {
  return source([path] { return text_corpus::read(path); }, checked_windows(context, windows_per_epoch),
                "text " + path);
}

source fortunes(int64_t context, int64_t windows_per_epoch) {
  return text_file(default_text_dir(), context, windows_per_epoch);
}

source text(std::string text, int64_t context, int64_t windows_per_epoch, std::string description) {
  auto t = std::make_shared<const std::string>(std::move(text));
  return source([t, description] { return text_corpus::from_text(*t, description); },
                checked_windows(context, windows_per_epoch), description);
}

} // namespace troupe::data
