#pragma once

// The training loss of a batch, the same for every role that computes one
// (the sequential loop, a worker, a pipeline's last stage): an image
// classifier's softmax cross-entropy, one label per sample, or a language
// model's per token, one target per position.

#include <cstdint>
#include <vector>

#include "kernels/context.hpp"
#include "tensor/tensor.hpp"

namespace troupe::model {

/// The mean cross-entropy of `logits` against `labels`: logits [B, classes]
/// with B labels, or a language model's logits [B, T, vocab] with B * T next
/// tokens (row-major [B, T]). Writes d(mean loss)/d(logits) into `dlogits`
/// when given. Throws troupe::error when the labels fit neither, and
/// troupe::diverged_error on a non-finite loss.
double cross_entropy(const kernels::context& ctx, const tensor& logits, const std::vector<int32_t>& labels,
                     tensor* dlogits);

} // namespace troupe::model
