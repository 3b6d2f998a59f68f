#pragma once

// Kernels of GPT-style transformer language models: layer norm, GELU, the
// causal self-attention core, token and position embeddings, token-level
// cross-entropy and AdamW. Activations are row-major [B, T, C] float32
// tensors (batch, time, channels). Like the kernels of kernels.hpp: the
// caller's context comes first, outputs are passed by reference and
// (re)allocated only when their shape differs, shape mismatches throw
// troupe::shape_error naming the kernel and the argument.

#include <cstdint>
#include <vector>

#include "kernels/context.hpp"
#include "tensor/tensor.hpp"

namespace troupe::kernels {

/// Token ids of a batch of sequences, row-major [batch, time]. A view: the
/// caller keeps the `batch * time` ids at `data` alive during the call.
struct token_ids {
  const int32_t* data = nullptr;
  int64_t batch = 0, time = 0;

  /// A view of `ids` as `batch` sequences; throws troupe::error when ids.size()
  /// is not a positive multiple of batch.
  static token_ids of(const std::vector<int32_t>& ids, int64_t batch);
  /// Not of a temporary: the view would outlive it.
  static token_ids of(std::vector<int32_t>&& ids, int64_t batch) = delete;
  int64_t count() const { return batch * time; }
};

// ---------------------------------------------------------------- layer norm

/// Normalizes each row of x (its last dimension, C) to zero mean and unit
/// variance (biased), then y = xhat * gamma + beta; gamma and beta are [C]
/// (beta may be undefined: no shift). x has any rank >= 1; its R = numel / C
/// rows are independent. mean and rstd ([R], R = B * T for [B, T, C]) receive
/// each row's mean and 1 / sqrt(var + eps) for the backward pass.
void layer_norm_forward(const context& ctx, const tensor& x, const tensor& gamma, const tensor& beta, float eps,
                        tensor& y, tensor& mean, tensor& rstd);
/// dx, and dgamma and dbeta ([C]), from the forward pass's x, mean and rstd.
/// dgamma and dbeta are overwritten (not accumulated). Each column of dgamma
/// and dbeta is summed over the rows in row order: the same bits whatever
/// the thread count.
void layer_norm_backward(const context& ctx, const tensor& x, const tensor& gamma, const tensor& mean,
                         const tensor& rstd, const tensor& dy, tensor& dx, tensor& dgamma, tensor& dbeta);

// ---------------------------------------------------------------- GELU

/// y = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), GPT-2's approximation, elementwise.
void gelu_forward(const context& ctx, const tensor& x, tensor& y);
/// dx = dy * gelu'(x). Unlike the activations of kernels.hpp it takes the
/// forward pass's input x, not its output (GELU is not invertible).
void gelu_backward(const context& ctx, const tensor& x, const tensor& dy, tensor& dx);

// ---------------------------------------------------------------- causal self-attention

/// The core of causal multi-head self-attention. qkv [B, T, 3C] holds the
/// queries, keys and values side by side in its last dimension (channels
/// [0, C), [C, 2C), [2C, 3C)), as the fused input projection writes them;
/// head h owns channels [h d, (h + 1) d) of each, d = C / heads. For each
/// batch element and head: S = Q K^T / sqrt(d), probs = softmax over the keys
/// j <= i of query i (entries j > i are 0), out = probs V. out is [B, T, C]
/// with head h in channels [h d, (h + 1) d). probs [B, heads, T, T] is kept
/// for the backward pass. The projections before and after are dense layers.
void attention_forward(const context& ctx, const tensor& qkv, int64_t heads, tensor& out, tensor& probs);
/// dqkv [B, T, 3C] (overwritten) from the forward pass's qkv and probs and
/// dout [B, T, C]. The number of heads is probs' second dimension.
void attention_backward(const context& ctx, const tensor& qkv, const tensor& probs, const tensor& dout,
                        tensor& dqkv);
/// Incremental decoding (generation that keeps the keys and values): the
/// attention of the n query rows at positions [start, start + n) of one
/// sequence. cache [P, 3C] (P >= start + n) holds the qkv rows of positions
/// [0, start + n), the new ones included; out becomes [1, n, C], the rows
/// [start, start + n) attention_forward gives for the sequence's first
/// start + n positions (up to rounding). scratch is the caller's, kept
/// between calls ([n, start + n] of scores per head).
void attention_decode(const context& ctx, const tensor& cache, int64_t start, int64_t n, int64_t heads, tensor& out,
                      tensor& scratch);

// ---------------------------------------------------------------- embeddings

/// y [B, T, C] = rows `tokens` of table [V, C]. Throws troupe::error naming
/// the token and where it is when a token is outside [0, V).
void embedding_forward(const context& ctx, const token_ids& tokens, const tensor& table, tensor& y);
/// dtable [V, C] = the sum of the rows of dy [B, T, C] over the positions of
/// each token (0 for tokens that do not occur). dtable must already be [V, C]
/// (the kernel cannot know V from the tokens); it is overwritten, not
/// accumulated. Deterministic: each row is summed in token order, the same
/// bits whatever the thread count.
void embedding_backward(const context& ctx, const token_ids& tokens, const tensor& dy, tensor& dtable);

/// The learned position embedding: y [B, T, C] += table[first + t] at every
/// time t (positions first..first+T-1; table is [T_max, C] with first + T <=
/// T_max; first is 0 but when decoding a sequence's later positions). Adds in
/// place, to the token embeddings embedding_forward wrote: GPT's input is their sum.
void position_embedding_forward(const context& ctx, const tensor& table, tensor& y, int64_t first = 0);
/// dtable [T_max, C] (must already have that shape; overwritten): row t is the
/// sum over the batch of dy [B, T, C] at time t, in batch order; rows from T
/// on are 0. The same bits whatever the thread count.
void position_embedding_backward(const context& ctx, const tensor& dy, tensor& dtable);

// ---------------------------------------------------------------- loss

/// The mean over the B * T tokens of the softmax cross-entropy of logits
/// [B, T, V] against targets ([B, T]). When dlogits is given it receives
/// d(mean loss)/d(logits). Throws troupe::error naming a target outside
/// [0, V) and where it is, and troupe::diverged_error on a non-finite loss.
float sequence_cross_entropy(const context& ctx, const tensor& logits, const token_ids& targets, tensor* dlogits);

// ---------------------------------------------------------------- optimizer

/// AdamW (Loshchilov & Hutter): Adam with bias correction on g alone, and
/// weight decay decoupled from it: w -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * w).
/// (kernels::adam_step adds weight_decay * w to the gradient instead: L2.)
/// `step` counts from 1.
void adamw_step(const context& ctx, tensor& w, const tensor& g, tensor& m, tensor& v, float lr, float beta1,
                float beta2, float eps, float weight_decay, int64_t step);

} // namespace troupe::kernels
