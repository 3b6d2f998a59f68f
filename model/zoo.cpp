#include "model/zoo.hpp"

#include <cmath>

#include "model/nn.hpp"

namespace troupe::zoo {

using namespace troupe::nn;

model::model mlp() {
  return sequential(flatten(), dense(784, 256), relu(), dense(256, 128), relu(), dense(128, 10));
}

model::model cnn() {
  return sequential(conv2d(1, 32, 3).padding(1), relu(), max_pool2d(2),
                    conv2d(32, 64, 3).padding(1), relu(), max_pool2d(2),
                    flatten(), dense(3136, 128), relu(), dense(128, 10));
}

namespace {

/// ResNet's basic block: two 3x3 convolutions with batch norm, a projection
/// shortcut where the shape changes.
residual basic_block(int64_t in, int64_t out, int64_t stride) {
  residual r(conv2d(in, out, 3).stride(stride).padding(1).bias(false), batch_norm(out), relu(),
             conv2d(out, out, 3).padding(1).bias(false), batch_norm(out));
  if (stride != 1 || in != out) r.projection(conv2d(in, out, 1).stride(stride).bias(false), batch_norm(out));
  return r;
}

} // namespace

model::model resnet(int64_t in_channels, int64_t classes) {
  std::vector<std::unique_ptr<model::layer>> layers;
  auto add = [&](const auto& l) { layers.push_back(l.make()); };
  add(conv2d(in_channels, 16, 3).padding(1).bias(false));
  add(batch_norm(16));
  add(relu());
  int64_t channels = 16;
  for (int64_t stage_channels : {16, 32, 64})
    for (int block = 0; block < 3; ++block) {
      add(basic_block(channels, stage_channels, block == 0 && stage_channels != 16 ? 2 : 1));
      add(relu());
      channels = stage_channels;
    }
  add(global_avg_pool());
  add(dense(64, classes));
  return model::model(std::move(layers));
}

std::vector<std::string> names() { return {"mlp", "cnn", "resnet"}; }

model::model by_name(const std::string& name) {
  if (name == "mlp") return mlp();
  if (name == "cnn") return cnn();
  if (name == "resnet") return resnet();
  throw error("unknown model '" + name + "': choose mlp, cnn or resnet");
}

model::model gpt(int64_t vocab, int64_t context, int64_t dim, int64_t heads, int64_t blocks, int64_t mlp_ratio) {
  if (blocks < 0) throw error("gpt: blocks must be >= 0, got " + std::to_string(blocks));
  std::vector<std::unique_ptr<model::layer>> layers;
  layers.push_back(embedding(vocab, dim).make());
  layers.push_back(positional_embedding(context, dim).make());
  // GPT-2's initialisation: N(0, 0.02) linears, the residual projections scaled by 1 / sqrt(2 x blocks).
  const float residual = blocks > 0 ? 1.0f / std::sqrt(2.0f * static_cast<float>(blocks)) : 1.0f;
  for (int64_t b = 0; b < blocks; ++b)
    layers.push_back(
        transformer_block(dim, heads, mlp_ratio).init(init_scheme::gpt2).residual_scale(residual).make());
  layers.push_back(layer_norm(dim).make());
  layers.push_back(sequence_dense(dim, vocab).init(init_scheme::gpt2).make());
  return model::model(std::move(layers));
}

double gpt_parameters(int64_t vocab, int64_t context, int64_t dim, int64_t blocks, int64_t mlp_ratio) {
  const double v = static_cast<double>(vocab), d = static_cast<double>(dim), h = d * static_cast<double>(mlp_ratio);
  const double norm = 2 * d;  // gain and shift
  const double block = norm + (d * 3 * d + 3 * d) + (d * d + d) + norm + (d * h + h) + (h * d + d);
  return v * d + static_cast<double>(context) * d + static_cast<double>(blocks) * block + norm + (d * v + v);
}

} // namespace troupe::zoo
