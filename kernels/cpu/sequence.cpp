#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/check.hpp"
#include "kernels/cpu/simd_set.hpp"
#include "kernels/kernels.hpp"
#include "kernels/sequence.hpp"

namespace troupe::kernels {

namespace {

/// x viewed as [rows, cols] by its last dimension.
struct row_view {
  int64_t rows, cols;
};

row_view rows_of(const tensor& x, const char* k) {
  detail::require(x.defined() && x.rank() >= 1, k, "x must have rank >= 1");
  const int64_t cols = x.dim(x.rank() - 1);
  detail::require(cols > 0, k, [&] { return "x has an empty last dimension: " + x.shape().to_string(); });
  return {x.numel() / cols, cols};
}

/// Threads for a loop over `items` independent items of `work` floats in all.
int loop_threads(const context& ctx, int64_t items, int64_t work) {
  if (!detail::split(ctx, work)) return 1;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(detail::threads(ctx), items)));
}

/// body(lo, hi) over [0, items) on loop_threads(ctx, items, work) threads, one contiguous range each.
template <class B>
void item_ranges(const context& ctx, int64_t items, int64_t work, B body) {
  const int n = loop_threads(ctx, items, work);
#pragma omp parallel num_threads(n) if (n > 1)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    body(items * t / nt, items * (t + 1) / nt);
  }
}

/// Start of part t of `parts` over [0, len), in multiples of 16 floats (one cache line).
int64_t part_start(int64_t len, int t, int parts) { return t == parts ? len : len * t / parts / 16 * 16; }

} // namespace

token_ids token_ids::of(const std::vector<int32_t>& ids, int64_t batch) {
  const int64_t n = static_cast<int64_t>(ids.size());
  if (batch <= 0 || n == 0 || n % batch != 0)
    throw error("token_ids: " + std::to_string(n) + " ids do not make " + std::to_string(batch) +
                " sequences of equal, positive length; give batch * time ids");
  return token_ids{ids.data(), batch, n / batch};
}

void layer_norm_forward(const context& ctx, const tensor& x, const tensor& gamma, const tensor& beta, float eps,
                        tensor& y, tensor& mean, tensor& rstd) {
  const char* k = "layer_norm_forward";
  const row_view d = rows_of(x, k);
  detail::require_shape(gamma, {d.cols}, k, "gamma");
  if (beta.defined()) detail::require_shape(beta, {d.cols}, k, "beta");
  ensure_shape(y, x.shape());
  ensure_shape(mean, {d.rows});
  ensure_shape(rstd, {d.rows});
  const float* bp = beta.defined() ? beta.data() : nullptr;
  const detail::layer_norm_args a{x.data(), d.rows, d.cols, gamma.data(), bp, eps, nullptr, nullptr, nullptr};
  float *yp = y.data(), *mp = mean.data(), *sp = rstd.data();
  const auto kernel = detail::active_simd_kernels().layer_norm_forward;  // the set's (sequence_set.cpp)
  item_ranges(ctx, d.rows, x.numel(), [&](int64_t r0, int64_t r1) { kernel(a, r0, r1, yp, mp, sp); });
}

void layer_norm_backward(const context& ctx, const tensor& x, const tensor& gamma, const tensor& mean,
                         const tensor& rstd, const tensor& dy, tensor& dx, tensor& dgamma, tensor& dbeta) {
  const char* k = "layer_norm_backward";
  const row_view d = rows_of(x, k);
  detail::require_shape(gamma, {d.cols}, k, "gamma");
  detail::require_shape(mean, {d.rows}, k, "mean");
  detail::require_shape(rstd, {d.rows}, k, "rstd");
  detail::require_same(x, dy, k, "x", "dy");
  ensure_shape(dx, x.shape());
  ensure_shape(dgamma, {d.cols});
  ensure_shape(dbeta, {d.cols});
  const detail::layer_norm_args a{x.data(), d.rows,    d.cols,      gamma.data(), nullptr,
                                  0.0f,     dy.data(), mean.data(), rstd.data()};
  const detail::simd_kernel_set& set = detail::active_simd_kernels();  // the set's loops (sequence_set.cpp)
  float* dxp = dx.data();
  item_ranges(ctx, d.rows, x.numel(), [&](int64_t r0, int64_t r1) { set.layer_norm_backward(a, r0, r1, dxp); });
  // dgamma, dbeta: one block of columns per thread, so that the sums do not depend on the thread count.
  const int parts = loop_threads(ctx, (d.cols + 15) / 16, x.numel());
  float *dg = dgamma.data(), *db = dbeta.data();
#pragma omp parallel num_threads(parts)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    set.layer_norm_params(a, part_start(d.cols, t, nt), part_start(d.cols, t + 1, nt), dg, db);
  }
}

// ---------------------------------------------------------------- GELU

// The active kernel set's loops (elementwise_set.cpp), by ranges over the threads.
void gelu_forward(const context& ctx, const tensor& x, tensor& y) {
  detail::apply_ranges(ctx, x, y, detail::active_simd_kernels().gelu_forward);
}

void gelu_backward(const context& ctx, const tensor& x, const tensor& dy, tensor& dx) {
  detail::apply_ranges(ctx, x, dy, dx, "gelu_backward", "x", "dy", detail::active_simd_kernels().gelu_backward);
}

// ---------------------------------------------------------------- causal self-attention

namespace {

/// The dimensions of an attention call.
struct attention_dims {
  int64_t batch, time, channels, heads, head;  // head: channels per head
  int64_t pairs() const { return batch * heads; }
};

attention_dims attention_check(const tensor& qkv, int64_t heads, const char* k) {
  detail::require_rank(qkv, 3, k, "qkv");
  detail::require(qkv.dim(2) > 0 && qkv.dim(2) % 3 == 0, k,
                  [&] {
                    return "qkv must be [B, T, 3C] (queries, keys and values side by side), got " +
                           qkv.shape().to_string();
                  });
  const int64_t c = qkv.dim(2) / 3;
  detail::require(heads >= 1 && c % heads == 0, k,
                  [&] { return std::to_string(heads) + " heads do not divide the " + std::to_string(c) +
                      " channels of qkv " + qkv.shape().to_string() + ": give heads >= 1 that divides C"; });
  detail::require(qkv.dim(0) > 0 && qkv.dim(1) > 0, k,
                  [&] { return "empty batch or sequence: qkv " + qkv.shape().to_string(); });
  return {qkv.dim(0), qkv.dim(1), c, heads, c / heads};
}

/// Threads of a loop over the (batch, head) pairs: the GEMMs inside run single-threaded
/// in a parallel region, on ctx's threads otherwise (a single pair).
int pair_threads(const context& ctx, const attention_dims& d) {
  return loop_threads(ctx, d.pairs(), d.pairs() * d.time * d.time * d.head);
}

/// Query rows per block of the attention's products: rows [i0, i1) see keys [0, i1) only, so the
/// products skip most of the masked future (3/8 of them at T = 128).
constexpr int64_t attention_block = 32;

/// One (batch, head): q at `q` (k and v C and 2C further, rows 3C apart), probs p [T, T], out rows C apart.
/// A block of query rows at a time: S = Q K^T / sqrt(d) and O = P V over the keys the block sees.
void attention_head_forward(const context& ctx, const attention_dims& d, const float* q, float* p, float* out) {
  const int64_t t = d.time, ld = 3 * d.channels, c = d.channels;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.head));
  for (int64_t i0 = 0; i0 < t; i0 += attention_block) {
    const int64_t i1 = std::min(t, i0 + attention_block), rows = i1 - i0;
    gemm(ctx, false, true, rows, i1, d.head, scale, q + i0 * ld, ld, q + c, ld, 0.0f, p + i0 * t, t);
    detail::active_simd_kernels().causal_softmax(p, t, i0, i1);  // the set's (sequence_set.cpp)
    gemm(ctx, false, false, rows, d.head, i1, 1.0f, p + i0 * t, t, q + 2 * c, ld, 0.0f, out + i0 * c, c);
  }
}

/// Rows [i0, i1): ds = p * (dp - rowsum(dp * p)), in place of dp; entries j > i become 0 (as p).
void softmax_backward_rows(const float* p, float* dp, int64_t t_len, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    const float* pr = p + i * t_len;
    float* gr = dp + i * t_len;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j <= i; ++j) s += pr[j] * gr[j];
#pragma omp simd
    for (int64_t j = 0; j <= i; ++j) gr[j] = pr[j] * (gr[j] - s);
    std::fill(gr + i + 1, gr + t_len, 0.0f);
  }
}

/// One (batch, head): dq at `dq` (dk and dv C and 2C further, rows 3C apart); dp is [T, T] scratch.
/// dP, dS and dQ by blocks of query rows (the keys each sees); dV and dK by blocks of keys (the
/// queries that see them: rows from the block's first key on).
void attention_head_backward(const context& ctx, const attention_dims& d, const float* q, const float* p,
                             const float* dout, float* dq, float* dp) {
  const int64_t t = d.time, ld = 3 * d.channels, c = d.channels;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.head));
  for (int64_t i0 = 0; i0 < t; i0 += attention_block) {
    const int64_t i1 = std::min(t, i0 + attention_block), rows = i1 - i0;
    gemm(ctx, false, true, rows, i1, d.head, 1.0f, dout + i0 * c, c, q + 2 * c, ld, 0.0f, dp + i0 * t, t);  // dP = dO V^T
    softmax_backward_rows(p, dp, t, i0, i1);                                                                  // dS
    gemm(ctx, false, false, rows, d.head, i1, scale, dp + i0 * t, t, q + c, ld, 0.0f, dq + i0 * ld, ld);  // dQ = dS K / sqrt(d)
  }
  for (int64_t j0 = 0; j0 < t; j0 += attention_block) {
    const int64_t j1 = std::min(t, j0 + attention_block), keys = j1 - j0, rows = t - j0;
    gemm(ctx, true, false, keys, d.head, rows, 1.0f, p + j0 * t + j0, t, dout + j0 * c, c, 0.0f,
         dq + 2 * c + j0 * ld, ld);  // dV = P^T dO
    gemm(ctx, true, false, keys, d.head, rows, scale, dp + j0 * t + j0, t, q + j0 * ld, ld, 0.0f, dq + c + j0 * ld,
         ld);  // dK = dS^T Q / sqrt(d)
  }
}

} // namespace

void attention_forward(const context& ctx, const tensor& qkv, int64_t heads, tensor& out, tensor& probs) {
  const attention_dims d = attention_check(qkv, heads, "attention_forward");
  ensure_shape(out, {d.batch, d.time, d.channels});
  ensure_shape(probs, {d.batch, d.heads, d.time, d.time});
  const float* in = qkv.data();
  float* o = out.data();
  float* p = probs.data();
  const int n = pair_threads(ctx, d);
#pragma omp parallel for schedule(static) num_threads(n) if (n > 1)
  for (int64_t pair = 0; pair < d.pairs(); ++pair) {
    const int64_t b = pair / d.heads, h = pair % d.heads;
    attention_head_forward(ctx, d, in + b * d.time * 3 * d.channels + h * d.head, p + pair * d.time * d.time,
                           o + b * d.time * d.channels + h * d.head);
  }
}

void attention_backward(const context& ctx, const tensor& qkv, const tensor& probs, const tensor& dout,
                        tensor& dqkv) {
  const char* k = "attention_backward";
  detail::require_rank(probs, 4, k, "probs");
  const attention_dims d = attention_check(qkv, probs.dim(1), k);
  detail::require_shape(probs, {d.batch, d.heads, d.time, d.time}, k, "probs");
  detail::require_shape(dout, {d.batch, d.time, d.channels}, k, "dout");
  ensure_shape(dqkv, qkv.shape());
  const float *in = qkv.data(), *p = probs.data(), *g = dout.data();
  float* out = dqkv.data();
  const int n = pair_threads(ctx, d);
#pragma omp parallel num_threads(n) if (n > 1)
  {
    std::vector<float> dp(static_cast<std::size_t>(d.time * d.time));
#pragma omp for schedule(static)
    for (int64_t pair = 0; pair < d.pairs(); ++pair) {
      const int64_t b = pair / d.heads, h = pair % d.heads;
      const int64_t at = b * d.time * 3 * d.channels + h * d.head;
      attention_head_backward(ctx, d, in + at, p + pair * d.time * d.time, g + b * d.time * d.channels + h * d.head,
                              out + at, dp.data());
    }
  }
}

void attention_decode(const context& ctx, const tensor& cache, int64_t start, int64_t n, int64_t heads, tensor& out,
                      tensor& scratch) {
  const char* k = "attention_decode";
  detail::require_rank(cache, 2, k, "cache");
  const int64_t total = start + n, ld = cache.dim(1), c = ld / 3;
  detail::require(start >= 0 && n >= 1 && cache.dim(0) >= total && ld > 0 && ld % 3 == 0, k, [&] {
    return "cache " + cache.shape().to_string() + " must be [P, 3C] with P >= start + n = " + std::to_string(start) +
           " + " + std::to_string(n);
  });
  detail::require(heads >= 1 && c % heads == 0, k,
                  [&] { return std::to_string(heads) + " heads do not divide the " + std::to_string(c) + " channels"; });
  ensure_shape(out, {1, n, c});
  ensure_shape(scratch, {heads, n, total});
  const attention_dims d{1, total, c, heads, c / heads};
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.head));
  const float* q = cache.data() + start * ld;
  const float* kv = cache.data();
  float* o = out.data();
  float* s = scratch.data();
  const int threads = pair_threads(ctx, d);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int64_t h = 0; h < heads; ++h) {
    float* p = s + h * n * total;
    const int64_t at = h * d.head;
    gemm(ctx, false, true, n, total, d.head, scale, q + at, ld, kv + c + at, ld, 0.0f, p, total);
    for (int64_t r = 0; r < n; ++r) {  // query start + r sees keys [0, start + r]
      float* row = p + r * total;
      const int64_t keys = start + r + 1;
      float m = row[0];
      for (int64_t j = 1; j < keys; ++j) m = std::max(m, row[j]);
      float sum = 0.0f;
      for (int64_t j = 0; j < keys; ++j) sum += (row[j] = std::exp(row[j] - m));
      const float inv = 1.0f / sum;
      for (int64_t j = 0; j < keys; ++j) row[j] *= inv;
      std::fill(row + keys, row + total, 0.0f);
    }
    gemm(ctx, false, false, n, d.head, total, 1.0f, p, total, kv + 2 * c + at, ld, 0.0f, o + at, c);
  }
}

// ---------------------------------------------------------------- embeddings

namespace {

/// Checks that tokens is a non-empty view and every id lies in [0, vocab); throws naming the first that does not.
void check_tokens(const token_ids& tokens, int64_t vocab, const char* k, const char* what) {
  detail::require(tokens.data != nullptr && tokens.batch > 0 && tokens.time > 0, k,
                  [&] { return std::string(what) + " must be a non-empty [batch, time] view, got [" +
                      std::to_string(tokens.batch) + ", " + std::to_string(tokens.time) + "]"; });
  for (int64_t n = 0; n < tokens.count(); ++n) {
    const int32_t id = tokens.data[n];
    if (id < 0 || id >= vocab)
      throw error(std::string(k) + ": " + what + " " + std::to_string(id) + " at batch " +
                  std::to_string(n / tokens.time) + ", time " + std::to_string(n % tokens.time) +
                  " is outside [0, " + std::to_string(vocab) + "): the vocabulary has " + std::to_string(vocab) +
                  " entries");
  }
}

void fill_zero(const context& ctx, tensor& t) {
  float* p = t.data();
  detail::parallel_ranges(ctx, t.numel(), [&](int64_t lo, int64_t hi) { std::fill(p + lo, p + hi, 0.0f); });
}

} // namespace

void embedding_forward(const context& ctx, const token_ids& tokens, const tensor& table, tensor& y) {
  const char* k = "embedding_forward";
  detail::require_rank(table, 2, k, "table");
  const int64_t c = table.dim(1);
  check_tokens(tokens, table.dim(0), k, "token");
  ensure_shape(y, {tokens.batch, tokens.time, c});
  const float* src = table.data();
  float* dst = y.data();
  const int32_t* ids = tokens.data;
#pragma omp parallel for schedule(static) num_threads(loop_threads(ctx, tokens.count(), y.numel()))
  for (int64_t n = 0; n < tokens.count(); ++n)
    std::memcpy(dst + n * c, src + ids[n] * c, static_cast<std::size_t>(c) * sizeof(float));
}

void embedding_backward(const context& ctx, const token_ids& tokens, const tensor& dy, tensor& dtable) {
  const char* k = "embedding_backward";
  detail::require_rank(dtable, 2, k, "dtable (allocate it [V, C], like the table)");
  const int64_t c = dtable.dim(1);
  check_tokens(tokens, dtable.dim(0), k, "token");
  detail::require_shape(dy, {tokens.batch, tokens.time, c}, k, "dy");
  fill_zero(ctx, dtable);
  const float* g = dy.data();
  float* out = dtable.data();
  const int32_t* ids = tokens.data;
  // One block of columns per thread, every token in order: the sums do not depend on the thread count.
  const int parts = loop_threads(ctx, (c + 15) / 16, dy.numel());
#pragma omp parallel num_threads(parts)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t lo = part_start(c, t, nt), hi = part_start(c, t + 1, nt);
    for (int64_t n = 0; n < tokens.count(); ++n) {
      float* row = out + ids[n] * c;
      const float* src = g + n * c;
#pragma omp simd
      for (int64_t j = lo; j < hi; ++j) row[j] += src[j];
    }
  }
}

void position_embedding_forward(const context& ctx, const tensor& table, tensor& y, int64_t first) {
  const char* k = "position_embedding_forward";
  detail::require_rank(table, 2, k, "table");
  detail::require_rank(y, 3, k, "y");
  const int64_t t_len = y.dim(1), c = y.dim(2);
  detail::require(first >= 0 && table.dim(1) == c && table.dim(0) - first >= t_len, k,
                  [&] { return "table " + table.shape().to_string() + " must be [T_max, C] with T_max >= " +
                      (first > 0 ? std::to_string(first) + " + " : std::string()) + "T for y " + y.shape().to_string(); });
  const float* src = table.data() + first * c;
  float* dst = y.data();
  const int64_t rows = y.dim(0) * t_len;
#pragma omp parallel for schedule(static) num_threads(loop_threads(ctx, rows, y.numel()))
  for (int64_t r = 0; r < rows; ++r) {
    const float* p = src + (r % t_len) * c;
    float* o = dst + r * c;
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) o[j] += p[j];
  }
}

void position_embedding_backward(const context& ctx, const tensor& dy, tensor& dtable) {
  const char* k = "position_embedding_backward";
  detail::require_rank(dtable, 2, k, "dtable (allocate it [T_max, C], like the table)");
  detail::require_rank(dy, 3, k, "dy");
  const int64_t batch = dy.dim(0), t_len = dy.dim(1), c = dy.dim(2);
  detail::require(dtable.dim(1) == c && dtable.dim(0) >= t_len, k,
                  [&] { return "dtable " + dtable.shape().to_string() + " must be [T_max, C] with T_max >= T for dy " +
                      dy.shape().to_string(); });
  const float* g = dy.data();
  float* out = dtable.data();
  std::fill(out + t_len * c, out + dtable.numel(), 0.0f);
#pragma omp parallel for schedule(static) num_threads(loop_threads(ctx, t_len, dy.numel()))
  for (int64_t t = 0; t < t_len; ++t) {
    float* o = out + t * c;
    std::fill(o, o + c, 0.0f);
    for (int64_t b = 0; b < batch; ++b) {
      const float* src = g + (b * t_len + t) * c;
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) o[j] += src[j];
    }
  }
}

// ---------------------------------------------------------------- loss

namespace {

/// The cross-entropy of one row z [V] against `target`; d (when given) receives softmax(z) * inv_n,
/// less inv_n at the target.
double row_cross_entropy(const float* z, int64_t vocab, int32_t target, float inv_n, float* d) {
  const float mx = *std::max_element(z, z + vocab);
  double sum = 0;
  if (d) {
    for (int64_t j = 0; j < vocab; ++j) {
      d[j] = std::exp(z[j] - mx);
      sum += d[j];
    }
    const float scale = static_cast<float>(inv_n / sum);
#pragma omp simd
    for (int64_t j = 0; j < vocab; ++j) d[j] *= scale;
    d[target] -= inv_n;
  } else {
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(z[j] - mx);
  }
  return mx + std::log(sum) - z[target];
}

} // namespace

float sequence_cross_entropy(const context& ctx, const tensor& logits, const token_ids& targets, tensor* dlogits) {
  const char* k = "sequence_cross_entropy";
  detail::require_rank(logits, 3, k, "logits");
  const int64_t vocab = logits.dim(2), rows = logits.dim(0) * logits.dim(1);
  detail::require(targets.batch == logits.dim(0) && targets.time == logits.dim(1), k,
                  [&] { return "targets are [" + std::to_string(targets.batch) + ", " + std::to_string(targets.time) +
                      "], logits " + logits.shape().to_string() + ": they must agree on [B, T]"; });
  check_tokens(targets, vocab, k, "target");
  if (dlogits) ensure_shape(*dlogits, logits.shape());
  std::vector<double> loss(static_cast<std::size_t>(rows));
  const float inv_n = 1.0f / static_cast<float>(rows);
  const float* z = logits.data();
  float* d = dlogits ? dlogits->data() : nullptr;
#pragma omp parallel for schedule(static) num_threads(loop_threads(ctx, rows, logits.numel()))
  for (int64_t r = 0; r < rows; ++r)
    loss[r] = row_cross_entropy(z + r * vocab, vocab, targets.data[r], inv_n, d ? d + r * vocab : nullptr);
  double total = 0;
  for (double l : loss) total += l;  // in row order: the same bits whatever the thread count
  const float mean = static_cast<float>(total / static_cast<double>(rows));
  if (!std::isfinite(mean))
    throw diverged_error(std::string(k) + ": loss is not finite (" + std::to_string(mean) +
                         "); the model diverged: lower the learning rate");
  return mean;
}

} // namespace troupe::kernels
