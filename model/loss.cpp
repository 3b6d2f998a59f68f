#include "model/loss.hpp"

#include <string>

#include "kernels/kernels.hpp"
#include "kernels/sequence.hpp"
#include "tensor/error.hpp"

namespace troupe::model {

double cross_entropy(const kernels::context& ctx, const tensor& logits, const std::vector<int32_t>& labels,
                     tensor* dlogits) {
  if (logits.rank() == 3) {
    if (static_cast<int64_t>(labels.size()) != logits.dim(0) * logits.dim(1))
      throw error("loss: " + std::to_string(labels.size()) + " next tokens for logits " + logits.shape().to_string() +
                  " (one per position expected)");
    return kernels::sequence_cross_entropy(ctx, logits, kernels::token_ids::of(labels, logits.dim(0)), dlogits);
  }
  if (logits.rank() != 2 || static_cast<int64_t>(labels.size()) != logits.dim(0))
    throw error("loss: " + std::to_string(labels.size()) + " labels for logits " + logits.shape().to_string() +
                " (one per sample expected)");
  return kernels::softmax_cross_entropy(ctx, logits, labels, dlogits);
}

} // namespace troupe::model
