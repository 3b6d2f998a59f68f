// troupe_torch_baseline: trains troupe's reference MLP, CNN or ResNet-20 with libtorch on
// (Fashion-)MNIST, fed by troupe's own batcher, and prints one JSON line with
// the training throughput and test accuracy, to compare against troupe.

#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>

#include <torch/torch.h>

#include "data/dataset.hpp"

namespace {

struct options {
  std::string model = "mlp";
  int epochs = 1;
  int64_t max_steps = 0;  // 0: whole epochs
  int64_t batch_size = 64;
  double lr = 0.05;
  double momentum = 0.9;
  int threads = 2;
  uint64_t seed = 1;
  std::string data_dir;
};

/// A bad command line: main prints the message and exits with status 2.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const char* const usage_text =
    "usage: troupe_torch_baseline [options]\n"
    "Trains troupe's reference model with libtorch and prints one JSON line.\n"
    "  --model mlp|cnn|resnet  model to train (default mlp)\n"
    "  --epochs N          training epochs (default 1)\n"
    "  --max-steps N       stop after N steps (default 0: whole epochs)\n"
    "  --batch-size N      batch size (default 64)\n"
    "  --lr F              SGD learning rate (default 0.05)\n"
    "  --momentum F        SGD momentum (default 0.9)\n"
    "  --threads N         intra-op threads (default 2)\n"
    "  --seed N            seed for initialization and shuffling (default 1)\n"
    "  --data-dir DIR      MNIST-format data directory (default: Fashion-MNIST\n"
    "                      from Debian's dataset-fashion-mnist)\n"
    "Options also accept --name=value.\n";

/// Parses `text` as a T, the whole of it, or throws usage_error naming `name`.
template <typename T>
T parse_value(const std::string& name, const std::string& text) {
  std::istringstream in(text);
  T value{};
  if (!(in >> value) || !in.eof()) {
    throw usage_error("invalid value '" + text + "' for --" + name);
  }
  return value;
}

/// Reads the command line into `opt`; returns false when --help was given.
bool parse_args(int argc, char** argv, options& opt) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") return false;
    if (arg.rfind("--", 0) != 0) throw usage_error("unexpected argument '" + arg + "'");
    std::string name = arg.substr(2);
    std::string value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    } else {
      bool known = name == "model" || name == "epochs" || name == "max-steps" || name == "batch-size" ||
                   name == "lr" || name == "momentum" || name == "threads" ||
                   name == "seed" || name == "data-dir";
      if (!known) throw usage_error("unknown option '" + arg + "'");
      if (i + 1 >= argc) throw usage_error("option --" + name + " needs a value");
      value = argv[++i];
    }
    if (name == "model") {
      opt.model = value;
    } else if (name == "epochs") {
      opt.epochs = parse_value<int>(name, value);
    } else if (name == "max-steps") {
      opt.max_steps = parse_value<int64_t>(name, value);
    } else if (name == "batch-size") {
      opt.batch_size = parse_value<int64_t>(name, value);
    } else if (name == "lr") {
      opt.lr = parse_value<double>(name, value);
    } else if (name == "momentum") {
      opt.momentum = parse_value<double>(name, value);
    } else if (name == "threads") {
      opt.threads = parse_value<int>(name, value);
    } else if (name == "seed") {
      opt.seed = parse_value<uint64_t>(name, value);
    } else if (name == "data-dir") {
      opt.data_dir = value;
    } else {
      throw usage_error("unknown option '" + arg + "'");
    }
  }
  if (opt.model != "mlp" && opt.model != "cnn" && opt.model != "resnet") {
    throw usage_error("--model must be mlp, cnn or resnet, not '" + opt.model + "'");
  }
  if (opt.epochs < 1) throw usage_error("--epochs must be at least 1");
  if (opt.max_steps < 0) throw usage_error("--max-steps must be at least 0");
  if (opt.batch_size < 1) throw usage_error("--batch-size must be at least 1");
  if (opt.threads < 1) throw usage_error("--threads must be at least 1");
  return true;
}

/// ResNet's basic block as troupe's zoo builds it: two 3x3 convolutions
/// without bias, each with batch norm, ReLU between them; a projection
/// shortcut (1x1 convolution, batch norm) where the shape changes; ReLU after
/// the sum. (TORCH_MODULE(basic_block) wants the name basic_blockImpl.)
struct basic_blockImpl : torch::nn::Module {
  basic_blockImpl(int64_t in, int64_t out, int64_t stride)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3)
                                                             .stride(stride).padding(1).bias(false)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(out))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(out, out, 3)
                                                             .padding(1).bias(false)))),
        bn2(register_module("bn2", torch::nn::BatchNorm2d(out))) {
    if (stride != 1 || in != out) {
      projection = register_module(
          "projection",
          torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)),
                                torch::nn::BatchNorm2d(out)));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor y = bn2(conv2(torch::relu(bn1(conv1(x)))));
    return torch::relu(y + (projection ? projection->forward(x) : x));
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Sequential projection{nullptr};
};
TORCH_MODULE(basic_block);

/// troupe's reference models, for images of shape [c, h, w].
torch::nn::Sequential make_model(const std::string& name, int64_t c, int64_t h, int64_t w) {
  namespace nn = torch::nn;
  if (name == "resnet") {
    // zoo::resnet: ResNet-20, three stages of three blocks of 16, 32, 64 channels.
    nn::Sequential net(nn::Conv2d(nn::Conv2dOptions(c, 16, 3).padding(1).bias(false)), nn::BatchNorm2d(16),
                       nn::ReLU());
    int64_t channels = 16;
    for (int64_t stage : {16, 32, 64}) {
      for (int block = 0; block < 3; ++block) {
        net->push_back(basic_block(channels, stage, block == 0 && stage != 16 ? 2 : 1));
        channels = stage;
      }
    }
    net->push_back(nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions(1)));
    net->push_back(nn::Flatten());
    net->push_back(nn::Linear(64, 10));
    return net;
  }
  if (name == "mlp") {
    return nn::Sequential(nn::Flatten(), nn::Linear(c * h * w, 256), nn::ReLU(),
                          nn::Linear(256, 128), nn::ReLU(), nn::Linear(128, 10));
  }
  return nn::Sequential(
      nn::Conv2d(nn::Conv2dOptions(c, 32, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(2),
      nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(2),
      nn::Flatten(), nn::Linear(64 * (h / 4) * (w / 4), 128), nn::ReLU(),
      nn::Linear(128, 10));
}

/// Views a troupe batch as torch tensors without copying the images; labels
/// become int64 class indices, as cross_entropy wants.
std::pair<torch::Tensor, torch::Tensor> to_torch(troupe::data::batch& b,
                                                 const troupe::data::image_dataset& ds) {
  int64_t n = b.size();
  torch::Tensor images = torch::from_blob(b.images.data(), {n, ds.channels, ds.height, ds.width},
                                          torch::kFloat32);
  torch::Tensor labels =
      torch::from_blob(b.labels.data(), {n}, torch::kInt32).to(torch::kInt64);
  return {images, labels};
}

/// A finite number as JSON, or null.
std::string json_number(double x, int precision) {
  if (!std::isfinite(x)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", precision, x);
  return buf;
}

int run(const options& opt) {
  // Must come before any parallel work starts the inter-op pool.
  at::set_num_interop_threads(1);
  torch::set_num_threads(opt.threads);
  torch::manual_seed(opt.seed);

  std::string dir = opt.data_dir.empty() ? troupe::data::default_fashion_mnist_dir()
                                         : opt.data_dir;
  troupe::data::train_test data = troupe::data::load_mnist_dir(dir);
  troupe::data::normalization norm = troupe::data::compute_normalization(data.train);
  std::cerr << "libtorch " << TORCH_VERSION << ": " << opt.model << " on " << dir << " ("
            << data.train.count << " train, " << data.test.count << " test), "
            << torch::get_num_threads() << " threads\n";

  torch::nn::Sequential model =
      make_model(opt.model, data.train.channels, data.train.height, data.train.width);
  torch::optim::SGD optimizer(model->parameters(),
                              torch::optim::SGDOptions(opt.lr).momentum(opt.momentum));

  troupe::data::batcher train(data.train, opt.batch_size, norm, opt.seed, /*shuffle=*/true);
  troupe::data::batch b;
  int64_t samples = 0, steps = 0;
  double last_epoch_loss = 0.0;

  // Training: the only timed part.
  model->train();
  auto t0 = std::chrono::steady_clock::now();
  for (int epoch = 0; epoch < opt.epochs; ++epoch) {
    auto e0 = std::chrono::steady_clock::now();
    train.start_epoch(epoch);
    double loss_sum = 0.0;
    int64_t epoch_samples = 0;
    while ((opt.max_steps == 0 || steps < opt.max_steps) && train.next(b)) {
      ++steps;
      auto [images, labels] = to_torch(b, data.train);
      optimizer.zero_grad();
      torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(images), labels);
      loss.backward();
      optimizer.step();
      loss_sum += loss.item<double>() * b.size();
      epoch_samples += b.size();
    }
    samples += epoch_samples;
    last_epoch_loss = epoch_samples > 0 ? loss_sum / epoch_samples : 0.0;
    std::chrono::duration<double> es = std::chrono::steady_clock::now() - e0;
    std::cerr << "epoch " << epoch + 1 << "/" << opt.epochs << ": loss " << last_epoch_loss
              << ", " << es.count() << " s\n";
  }
  std::chrono::duration<double> train_s = std::chrono::steady_clock::now() - t0;

  // Test accuracy.
  model->eval();
  torch::NoGradGuard no_grad;
  troupe::data::batcher test(data.test, opt.batch_size, norm, opt.seed, /*shuffle=*/false);
  test.start_epoch(0);
  int64_t correct = 0, seen = 0;
  while (test.next(b)) {
    auto [images, labels] = to_torch(b, data.test);
    correct += model->forward(images).argmax(1).eq(labels).sum().item<int64_t>();
    seen += b.size();
  }
  double accuracy = seen > 0 ? static_cast<double>(correct) / seen : 0.0;

  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  double peak_rss_mb = static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB

  std::cout << "{\"impl\":\"libtorch\",\"model\":\"" << opt.model << "\",\"epochs\":" << opt.epochs
            << ",\"batch_size\":" << opt.batch_size << ",\"threads\":" << opt.threads
            << ",\"train_loss\":" << json_number(last_epoch_loss, 6)
            << ",\"test_accuracy\":" << json_number(accuracy, 4)
            << ",\"samples_per_s\":" << json_number(samples / train_s.count(), 1)
            << ",\"train_s\":" << json_number(train_s.count(), 3)
            << ",\"peak_rss_mb\":" << json_number(peak_rss_mb, 1) << "}" << std::endl;
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  options opt;
  try {
    if (!parse_args(argc, argv, opt)) {
      std::cout << usage_text;
      return 0;
    }
  } catch (const usage_error& e) {
    std::cerr << "troupe_torch_baseline: " << e.what() << "\n(--help lists the options)\n";
    return 2;
  }
  try {
    return run(opt);
  } catch (const std::exception& e) {
    std::cerr << "troupe_torch_baseline: " << e.what() << "\n";
    return 1;
  }
}
