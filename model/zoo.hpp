#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model.hpp"

namespace troupe::zoo {

/// MLP 784-256-128-10 with ReLU, for 1x28x28 images.
model::model mlp();
/// conv 1->32 3x3 pad 1, ReLU, maxpool 2, conv 32->64 3x3 pad 1, ReLU, maxpool 2,
/// dense 3136->128, ReLU, dense 128->10.
model::model cnn();
/// ResNet-20 (He et al. 2016, section 4.2) for images of `in_channels` channels
/// of any size from 8x8 (28x28 Fashion-MNIST, 32x32 CIFAR-10: resnet(3)):
/// conv 3x3 -> 16, batch norm, ReLU; three stages of three basic blocks
/// (residual(conv 3x3, batch norm, ReLU, conv 3x3, batch norm), then ReLU) of
/// 16, 32 and 64 channels, the second and third stage starting with stride 2
/// and a projection shortcut (conv 1x1 stride 2, batch norm); global average
/// pooling; dense 64 -> `classes`. Convolutions have no bias (batch norm follows).
model::model resnet(int64_t in_channels = 1, int64_t classes = 10);
/// "mlp", "cnn" or "resnet" (for 1-channel images); throws troupe::error listing the choices otherwise.
model::model by_name(const std::string& name);
std::vector<std::string> names();

/// A GPT-style decoder-only language model (Radford et al. 2019) over token ids:
/// input [context] ids per sample, output [context, vocab] next-token logits.
/// embedding(vocab, dim), positional_embedding(context, dim), `blocks` pre-norm
/// transformer_block(dim, heads, mlp_ratio), layer_norm(dim) and an untied head
/// sequence_dense(dim, vocab). Defaults: context 128, 128 features, 4 heads,
/// 4 blocks, mlp_ratio 4. Build it for input {context} (or any shorter length).
/// GPT-2's initialisation: linears N(0, 0.02), the two residual projections
/// of each block N(0, 0.02 / sqrt(2 x blocks)), embeddings N(0, 0.02).
model::model gpt(int64_t vocab, int64_t context = 128, int64_t dim = 128, int64_t heads = 4, int64_t blocks = 4,
                 int64_t mlp_ratio = 4);
/// The parameters of gpt(vocab, context, dim, heads, blocks, mlp_ratio), counted without building it
/// (as a double: the sizes a job file allows can make it larger than 2^63).
double gpt_parameters(int64_t vocab, int64_t context, int64_t dim, int64_t blocks, int64_t mlp_ratio);

} // namespace troupe::zoo
