// troupe_torch_baseline: trains troupe's reference MLP, CNN or ResNet-20 with libtorch on
// (Fashion-)MNIST, fed by troupe's own batcher, or troupe's GPT (zoo::gpt) on
// text, fed by troupe's own window sampler (the trainer's very windows), and
// prints one JSON line with the training throughput and test accuracy (test
// loss for gpt), to compare against troupe.

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iostream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "data/dataset.hpp"
#include "data/text.hpp"

namespace {

struct options {
  std::string model = "mlp";
  int epochs = 1;
  int64_t max_steps = 0;  // 0: whole epochs
  std::optional<int64_t> batch_size;  // default 64; gpt 32
  std::optional<double> lr;           // default 0.05 (SGD); gpt 0.001 (AdamW)
  double momentum = 0.9;
  std::optional<double> weight_decay;  // default 0; gpt 0.01 (decoupled)
  int threads = 2;
  uint64_t seed = 1;
  std::string data_dir;
  // gpt only: the trainer's defaults (train/job_file.cpp, train/data_source.hpp).
  int64_t context = 128;
  int64_t windows_per_epoch = 4096;
  double validation_fraction = 0;
  std::string schedule = "cosine";
  std::string init = "gpt2";
  int64_t log_every = 0;
};

/// A bad command line: main prints the message and exits with status 2.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const char* const usage_text =
    "usage: troupe_torch_baseline [options]\n"
    "Trains troupe's reference model with libtorch and prints one JSON line.\n"
    "  --model mlp|cnn|resnet|gpt  model to train (default mlp)\n"
    "  --epochs N          training epochs (default 1)\n"
    "  --max-steps N       stop after N steps (default 0: whole epochs)\n"
    "  --batch-size N      batch size (default 64; gpt 32)\n"
    "  --lr F              learning rate (default 0.05, SGD; gpt 0.001, AdamW)\n"
    "  --momentum F        SGD momentum (default 0.9)\n"
    "  --weight-decay F    weight decay (default 0; gpt 0.01, AdamW's decoupled one)\n"
    "  --threads N         intra-op threads (default 2)\n"
    "  --seed N            seed for initialization and shuffling (default 1)\n"
    "  --data-dir DIR      MNIST-format data directory (default: Fashion-MNIST\n"
    "                      from Debian's dataset-fashion-mnist); gpt: a text file or\n"
    "                      a directory of them (default: Debian's fortunes)\n"
    "gpt only (troupe_trainer --model gpt's defaults):\n"
    "  --context N         tokens per window (default 128)\n"
    "  --windows-per-epoch N  random windows per epoch (default 4096)\n"
    "  --validation-fraction F  text held out for validation (default 0)\n"
    "  --lr-schedule cosine|constant  (default cosine, to 0 over the epochs)\n"
    "  --init gpt2|troupe  gpt2: nanoGPT's N(0, 0.02) weights (default); troupe:\n"
    "                      troupe's Xavier-uniform linears\n"
    "  --log-every N       print the step's loss every N steps to stderr (default 0: never)\n"
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

/// Each option's name and how its value goes into `options`: the one list of the options.
using text = const std::string&;
using option_setter = void (*)(options&, text name, text value);
const std::vector<std::pair<std::string, option_setter>>& option_table() {
  static const std::vector<std::pair<std::string, option_setter>> table{
      {"model", [](options& o, text, text v) { o.model = v; }},
      {"epochs", [](options& o, text n, text v) { o.epochs = parse_value<int>(n, v); }},
      {"max-steps", [](options& o, text n, text v) { o.max_steps = parse_value<int64_t>(n, v); }},
      {"batch-size", [](options& o, text n, text v) { o.batch_size = parse_value<int64_t>(n, v); }},
      {"lr", [](options& o, text n, text v) { o.lr = parse_value<double>(n, v); }},
      {"momentum", [](options& o, text n, text v) { o.momentum = parse_value<double>(n, v); }},
      {"weight-decay", [](options& o, text n, text v) { o.weight_decay = parse_value<double>(n, v); }},
      {"threads", [](options& o, text n, text v) { o.threads = parse_value<int>(n, v); }},
      {"seed", [](options& o, text n, text v) { o.seed = parse_value<uint64_t>(n, v); }},
      {"data-dir", [](options& o, text, text v) { o.data_dir = v; }},
      {"context", [](options& o, text n, text v) { o.context = parse_value<int64_t>(n, v); }},
      {"windows-per-epoch",
       [](options& o, text n, text v) { o.windows_per_epoch = parse_value<int64_t>(n, v); }},
      {"validation-fraction",
       [](options& o, text n, text v) { o.validation_fraction = parse_value<double>(n, v); }},
      {"lr-schedule", [](options& o, text, text v) { o.schedule = v; }},
      {"init", [](options& o, text, text v) { o.init = v; }},
      {"log-every", [](options& o, text n, text v) { o.log_every = parse_value<int64_t>(n, v); }},
  };
  return table;
}

/// The model's defaults for the options left out, then every value's range.
void finish_options(options& opt) {
  if (opt.model != "mlp" && opt.model != "cnn" && opt.model != "resnet" && opt.model != "gpt") {
    throw usage_error("--model must be mlp, cnn, resnet or gpt, not '" + opt.model + "'");
  }
  const bool gpt = opt.model == "gpt";
  if (!opt.batch_size) opt.batch_size = gpt ? 32 : 64;
  if (!opt.lr) opt.lr = gpt ? 1e-3 : 0.05;
  if (!opt.weight_decay) opt.weight_decay = gpt ? 0.01 : 0.0;
  if (opt.epochs < 1) throw usage_error("--epochs must be at least 1");
  if (opt.max_steps < 0) throw usage_error("--max-steps must be at least 0");
  if (*opt.batch_size < 1) throw usage_error("--batch-size must be at least 1");
  if (opt.threads < 1) throw usage_error("--threads must be at least 1");
  if (opt.context < 1) throw usage_error("--context must be at least 1");
  if (opt.windows_per_epoch < 1) throw usage_error("--windows-per-epoch must be at least 1");
  if (!(opt.validation_fraction >= 0 && opt.validation_fraction < 1))
    throw usage_error("--validation-fraction must be in [0, 1)");
  if (opt.schedule != "cosine" && opt.schedule != "constant")
    throw usage_error("--lr-schedule must be cosine or constant, not '" + opt.schedule + "'");
  if (opt.init != "gpt2" && opt.init != "troupe")
    throw usage_error("--init must be gpt2 or troupe, not '" + opt.init + "'");
  if (opt.log_every < 0) throw usage_error("--log-every must be at least 0");
}

/// Reads the command line into `opt`; returns false when --help was given.
bool parse_args(int argc, char** argv, options& opt) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") return false;
    if (arg.rfind("--", 0) != 0) throw usage_error("unexpected argument '" + arg + "'");
    std::string name = arg.substr(2);
    const auto eq = name.find('=');
    if (eq != std::string::npos) name.resize(eq);
    const auto& table = option_table();
    const auto it = std::find_if(table.begin(), table.end(), [&](const auto& e) { return e.first == name; });
    if (it == table.end()) throw usage_error("unknown option '" + arg + "'");
    if (eq == std::string::npos && i + 1 >= argc) throw usage_error("option --" + name + " needs a value");
    const std::string value = eq != std::string::npos ? arg.substr(2 + eq + 1) : argv[++i];
    it->second(opt, name, value);
  }
  finish_options(opt);
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

/// This process's peak resident set, MB.
double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB
}

// ---------------------------------------------------------------- gpt

/// zoo::gpt's sizes: 4 pre-norm blocks of 128 features, 4 heads, an MLP 4x as wide.
struct gpt_config {
  int64_t vocab = 0, context = 128, dim = 128, heads = 4, blocks = 4, mlp_ratio = 4;
};

/// Causal multi-head self-attention as nanoGPT writes it without flash
/// attention (libtorch 1.13 has no scaled_dot_product_attention): a fused QKV
/// projection, Q K^T / sqrt(d) with the future masked to -inf, softmax, times
/// V, heads side by side again, the output projection.
struct attentionImpl : torch::nn::Module {
  explicit attentionImpl(const gpt_config& c)
      : qkv(register_module("qkv", torch::nn::Linear(c.dim, 3 * c.dim))),
        proj(register_module("proj", torch::nn::Linear(c.dim, c.dim))),
        heads(c.heads),
        future(register_buffer("future", torch::ones({c.context, c.context}, torch::kBool).triu(1))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2), d = c / heads;
    std::vector<torch::Tensor> qkv_parts = qkv(x).split(c, 2);
    auto head_view = [&](const torch::Tensor& a) { return a.view({b, t, heads, d}).transpose(1, 2); };
    torch::Tensor q = head_view(qkv_parts[0]), k = head_view(qkv_parts[1]), v = head_view(qkv_parts[2]);
    torch::Tensor att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(d)));
    att = att.masked_fill(future.slice(0, 0, t).slice(1, 0, t), -std::numeric_limits<float>::infinity());
    torch::Tensor y = torch::matmul(torch::softmax(att, -1), v);  // [B, heads, T, d]
    return proj(y.transpose(1, 2).contiguous().view({b, t, c}));
  }
  torch::nn::Linear qkv, proj;
  int64_t heads;
  torch::Tensor future;  // true above the diagonal: the positions a query may not see
};
TORCH_MODULE(attention);

/// transformer_block(dim, heads, mlp_ratio): x + attn(ln1(x)), then x + out(gelu(fc(ln2(x)))),
/// GELU in GPT-2's tanh approximation as troupe's.
struct blockImpl : torch::nn::Module {
  explicit blockImpl(const gpt_config& c)
      : ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim}).eps(1e-5)))),
        attn(register_module("attn", attention(c))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim}).eps(1e-5)))),
        fc(register_module("fc", torch::nn::Linear(c.dim, c.mlp_ratio * c.dim))),
        out(register_module("out", torch::nn::Linear(c.mlp_ratio * c.dim, c.dim))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = x + attn(ln1(x));
    return x + out(torch::gelu(fc(ln2(x)), "tanh"));
  }
  torch::nn::LayerNorm ln1;
  attention attn;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear fc, out;
};
TORCH_MODULE(block);

/// zoo::gpt: token + learned position embeddings, the blocks, a final layer norm, an untied head with a bias.
struct gptImpl : torch::nn::Module {
  explicit gptImpl(const gpt_config& c)
      : wte(register_module("wte", torch::nn::Embedding(c.vocab, c.dim))),
        wpe(register_module("wpe", torch::nn::Embedding(c.context, c.dim))),
        ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim}).eps(1e-5)))),
        head(register_module("head", torch::nn::Linear(c.dim, c.vocab))) {
    for (int64_t i = 0; i < c.blocks; ++i) blocks.push_back(register_module("block" + std::to_string(i), block(c)));
  }
  /// Logits [B, T, vocab] of token ids [B, T] (int64).
  torch::Tensor forward(const torch::Tensor& ids) {
    torch::Tensor x = wte(ids) + wpe(torch::arange(ids.size(1), torch::kLong));
    for (auto& b : blocks) x = b(x);
    return head(ln_f(x));
  }
  torch::nn::Embedding wte, wpe;
  std::vector<block> blocks;
  torch::nn::LayerNorm ln_f;
  torch::nn::Linear head;
};
TORCH_MODULE(gpt);

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

/// gpt2 (nanoGPT's): every weight N(0, 0.02), the projections into the residual stream
/// N(0, 0.02 / sqrt(2 blocks)), biases 0. troupe: embeddings N(0, 0.02), linear weights
/// Xavier-uniform, biases 0, as zoo::gpt. Layer norms start at gamma 1, beta 0 in both.
void init_gpt(gptImpl& model, const std::string& scheme, int64_t blocks) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.named_parameters()) {
    const std::string& name = p.key();
    torch::Tensor w = p.value();
    if (name.find("ln") != std::string::npos) continue;  // ln1, ln2, ln_f: LayerNorm's own 1 and 0
    if (ends_with(name, ".bias")) {
      w.zero_();
    } else if (name.rfind("wte", 0) == 0 || name.rfind("wpe", 0) == 0 || scheme == "gpt2") {
      const bool residual = ends_with(name, "attn.proj.weight") || ends_with(name, ".out.weight");
      w.normal_(0.0, residual && scheme == "gpt2" ? 0.02 / std::sqrt(2.0 * static_cast<double>(blocks)) : 0.02);
    } else {
      torch::nn::init::xavier_uniform_(w);
    }
  }
}

/// A window batch as torch tensors: ids [n, context] and targets [n, context], int64.
std::pair<torch::Tensor, torch::Tensor> to_torch(troupe::data::text_batch& b) {
  const int64_t n = b.size(), t = b.inputs.dim(1);
  torch::Tensor ids = torch::from_blob(b.inputs.data(), {n, t}, torch::kFloat32).to(torch::kLong);
  torch::Tensor targets = torch::from_blob(b.targets.data(), {n, t}, torch::kInt32).to(torch::kLong);
  return {ids, targets};
}

/// Mean token cross-entropy of logits [B, T, V] against targets [B, T].
torch::Tensor token_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.view({-1, logits.size(2)}), targets.view({-1}));
}

/// Loss and next-token accuracy on troupe's evaluation windows of a part (the trainer's score_text:
/// 256 windows drawn with seed 0x5c0de).
std::pair<double, double> score_text(gpt& model, const troupe::data::text_corpus& corpus,
                                     const troupe::data::text_part& part, int64_t context, int64_t batch) {
  constexpr int64_t windows = 256;
  torch::NoGradGuard no_grad;
  model->eval();
  troupe::data::window_sampler sampler(corpus, part, context, 0x5c0de);
  troupe::data::text_batch b;
  double loss_sum = 0;
  int64_t correct = 0, tokens = 0;
  for (int64_t done = 0; done < windows; done += b.size()) {
    sampler.sample(std::min(batch, windows - done), b);
    auto [ids, targets] = to_torch(b);
    torch::Tensor logits = model->forward(ids);
    loss_sum += token_loss(logits, targets).item<double>() * static_cast<double>(targets.numel());
    correct += logits.argmax(2).eq(targets).sum().item<int64_t>();
    tokens += targets.numel();
  }
  model->train();
  return {loss_sum / static_cast<double>(tokens), static_cast<double>(correct) / static_cast<double>(tokens)};
}

/// The trainer's learning rate at `step` (0-based): cosine from lr to 0 over `total` steps, or constant.
double scheduled_lr(const options& opt, int64_t step, int64_t total) {
  if (opt.schedule != "cosine" || total <= 0) return *opt.lr;
  return 0.5 * *opt.lr * (1 + std::cos(M_PI * std::min(1.0, static_cast<double>(step) / static_cast<double>(total))));
}

/// What a gpt run measured.
struct gpt_result {
  int64_t samples = 0, steps = 0;
  double train_s = 0, last_epoch_loss = 0, test_loss = 0, test_accuracy = 0;
  std::optional<double> validation_loss;
};

/// The data of a gpt run: troupe's corpus, its split and windows, as troupe_trainer builds them.
struct gpt_data {
  troupe::data::text_corpus corpus;
  troupe::data::text_parts parts;
};

gpt_data load_gpt_data(const options& opt) {
  gpt_data d{troupe::data::text_corpus::read(opt.data_dir.empty() ? troupe::data::default_text_dir()
                                                                   : opt.data_dir), {}};
  troupe::data::text_split_options split;
  split.validation = opt.validation_fraction;
  split.regions = std::min<int64_t>(split.regions, d.corpus.size());
  d.parts = d.corpus.split(split);
  return d;
}

/// One epoch of training: the trainer's windows of (seed, epoch); the loss of each step.
void train_gpt_epoch(const options& opt, const gpt_data& d, gpt& model, torch::optim::AdamW& optimizer,
                     int epoch, int64_t total_steps, gpt_result& r) {
  const uint64_t seed = opt.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch) + 1;
  troupe::data::window_sampler windows(d.corpus, d.parts.train, opt.context, seed);
  troupe::data::text_batch b;
  double loss_sum = 0;
  int64_t drawn = 0;
  auto t0 = std::chrono::steady_clock::now();
  while (drawn < opt.windows_per_epoch && (opt.max_steps == 0 || r.steps < opt.max_steps)) {
    windows.sample(std::min(*opt.batch_size, opt.windows_per_epoch - drawn), b);
    drawn += b.size();
    for (auto& g : optimizer.param_groups())
      static_cast<torch::optim::AdamWOptions&>(g.options()).lr(scheduled_lr(opt, r.steps, total_steps));
    auto [ids, targets] = to_torch(b);
    optimizer.zero_grad();
    torch::Tensor loss = token_loss(model->forward(ids), targets);
    loss.backward();
    optimizer.step();
    const double l = loss.item<double>();
    loss_sum += l * static_cast<double>(b.size());
    ++r.steps;
    if (opt.log_every > 0 && r.steps % opt.log_every == 0) std::cerr << "step " << r.steps << " loss " << l << "\n";
  }
  r.train_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.samples += drawn;
  r.last_epoch_loss = drawn > 0 ? loss_sum / static_cast<double>(drawn) : 0.0;
}

int run_gpt(const options& opt) {
  const gpt_data d = load_gpt_data(opt);
  gpt_config cfg;
  cfg.vocab = d.corpus.vocab_size();
  cfg.context = opt.context;
  gpt model(cfg);
  init_gpt(*model, opt.init, cfg.blocks);
  std::cerr << "libtorch " << TORCH_VERSION << ": gpt (vocabulary " << cfg.vocab << ", context " << cfg.context
            << ") on " << d.corpus.source() << " (" << d.parts.train.tokens() << " train tokens), "
            << torch::get_num_threads() << " threads\n";
  // Weight decay on the weight matrices only, not on biases, layer norms or
  // the embeddings (nanoGPT's grouping, and troupe's train::decays).
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : model->named_parameters()) {
    const bool embedding = p.key().rfind("wte.", 0) == 0 || p.key().rfind("wpe.", 0) == 0;
    (p.value().dim() >= 2 && !embedding ? decay : no_decay).push_back(p.value());
  }
  const auto options = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(*opt.lr).betas({0.9, 0.999}).eps(1e-8).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, options(*opt.weight_decay));
  groups.emplace_back(no_decay, options(0.0));
  torch::optim::AdamW optimizer(groups, torch::optim::AdamWOptions(*opt.lr));
  const int64_t per_epoch = (opt.windows_per_epoch + *opt.batch_size - 1) / *opt.batch_size;
  gpt_result r;
  model->train();
  for (int epoch = 0; epoch < opt.epochs && (opt.max_steps == 0 || r.steps < opt.max_steps); ++epoch) {
    train_gpt_epoch(opt, d, model, optimizer, epoch, per_epoch * opt.epochs, r);
    std::tie(r.test_loss, r.test_accuracy) = score_text(model, d.corpus, d.parts.test, opt.context, *opt.batch_size);
    if (!d.parts.validation.regions.empty())
      r.validation_loss = score_text(model, d.corpus, d.parts.validation, opt.context, *opt.batch_size).first;
    std::cerr << "epoch " << epoch + 1 << "/" << opt.epochs << ": train loss " << r.last_epoch_loss
              << ", test loss " << r.test_loss << " after " << r.steps << " steps\n";
  }
  std::cout << "{\"impl\":\"libtorch\",\"model\":\"gpt\",\"epochs\":" << opt.epochs << ",\"steps\":" << r.steps
            << ",\"batch_size\":" << *opt.batch_size << ",\"context\":" << opt.context
            << ",\"threads\":" << opt.threads << ",\"train_loss\":" << json_number(r.last_epoch_loss, 6)
            << ",\"test_loss\":" << json_number(r.test_loss, 6)
            << ",\"validation_loss\":" << (r.validation_loss ? json_number(*r.validation_loss, 6) : "null")
            << ",\"test_accuracy\":" << json_number(r.test_accuracy, 4)
            << ",\"samples_per_s\":" << json_number(static_cast<double>(r.samples) / r.train_s, 1)
            << ",\"tokens_per_s\":" << json_number(static_cast<double>(r.samples * opt.context) / r.train_s, 1)
            << ",\"train_s\":" << json_number(r.train_s, 3) << ",\"peak_rss_mb\":" << json_number(peak_rss_mb(), 1)
            << "}" << std::endl;
  return 0;
}

/// The model's accuracy on `test`, in evaluation mode (not timed).
double test_accuracy(const options& opt, torch::nn::Sequential& model, const troupe::data::image_dataset& test,
                     const troupe::data::normalization& norm) {
  model->eval();
  torch::NoGradGuard no_grad;
  troupe::data::batcher batches(test, *opt.batch_size, norm, opt.seed, /*shuffle=*/false);
  batches.start_epoch(0);
  troupe::data::batch b;
  int64_t correct = 0, seen = 0;
  while (batches.next(b)) {
    auto [images, labels] = to_torch(b, test);
    correct += model->forward(images).argmax(1).eq(labels).sum().item<int64_t>();
    seen += b.size();
  }
  return seen > 0 ? static_cast<double>(correct) / seen : 0.0;
}

int run_images(const options& opt) {
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
                              torch::optim::SGDOptions(*opt.lr).momentum(opt.momentum).weight_decay(*opt.weight_decay));

  troupe::data::batcher train(data.train, *opt.batch_size, norm, opt.seed, /*shuffle=*/true);
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

  const double accuracy = test_accuracy(opt, model, data.test, norm);

  std::cout << "{\"impl\":\"libtorch\",\"model\":\"" << opt.model << "\",\"epochs\":" << opt.epochs
            << ",\"batch_size\":" << *opt.batch_size << ",\"threads\":" << opt.threads
            << ",\"train_loss\":" << json_number(last_epoch_loss, 6)
            << ",\"test_accuracy\":" << json_number(accuracy, 4)
            << ",\"samples_per_s\":" << json_number(samples / train_s.count(), 1)
            << ",\"train_s\":" << json_number(train_s.count(), 3)
            << ",\"peak_rss_mb\":" << json_number(peak_rss_mb(), 1) << "}" << std::endl;
  return 0;
}

int run(const options& opt) {
  // Must come before any parallel work starts the inter-op pool.
  at::set_num_interop_threads(1);
  torch::set_num_threads(opt.threads);
  torch::manual_seed(opt.seed);
  return opt.model == "gpt" ? run_gpt(opt) : run_images(opt);
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
