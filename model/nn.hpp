#pragma once

// The model-definition DSL. Layers are values with named setters; a model is
// built from them:
//
//   using namespace troupe::nn;
//   auto net = sequential(conv2d(1, 32, 3).padding(1), relu(), max_pool2d(2),
//                         flatten(), dense(6272, 10));
//   net.build({1, 28, 28}, /*seed=*/1);   // shape inference + initialisation
//   std::cout << net.summary();

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "model/layer.hpp"
#include "model/model.hpp"

namespace troupe::nn {

using model::init_scheme;

/// Fully connected layer: y = x W^T + b, W [out, in]. Input [in] (flatten first).
struct dense {
  int64_t in_features, out_features;
  dense(int64_t in, int64_t out) : in_features(in), out_features(out) {}
  dense& bias(bool b) { bias_ = b; return *this; }
  dense& init(init_scheme s) { init_ = s; return *this; }
  bool bias() const { return bias_; }
  init_scheme init() const { return init_; }
  std::unique_ptr<model::layer> make() const;

private:
  bool bias_ = true;
  init_scheme init_ = init_scheme::he;
};

/// 2-D convolution over [c, h, w] inputs, square kernel.
struct conv2d {
  int64_t in_channels, out_channels, kernel_size;
  conv2d(int64_t in, int64_t out, int64_t kernel) : in_channels(in), out_channels(out), kernel_size(kernel) {}
  conv2d& stride(int64_t s) { stride_ = s; return *this; }
  conv2d& padding(int64_t p) { padding_ = p; return *this; }
  conv2d& bias(bool b) { bias_ = b; return *this; }
  conv2d& init(init_scheme s) { init_ = s; return *this; }
  int64_t stride() const { return stride_; }
  int64_t padding() const { return padding_; }
  bool bias() const { return bias_; }
  init_scheme init() const { return init_; }
  std::unique_ptr<model::layer> make() const;

private:
  int64_t stride_ = 1, padding_ = 0;
  bool bias_ = true;
  init_scheme init_ = init_scheme::he;
};

/// Max pooling with a square window; stride defaults to the window size.
struct max_pool2d {
  int64_t kernel_size;
  explicit max_pool2d(int64_t kernel) : kernel_size(kernel), stride_(kernel) {}
  max_pool2d& stride(int64_t s) { stride_ = s; return *this; }
  int64_t stride() const { return stride_; }
  std::unique_ptr<model::layer> make() const;

private:
  int64_t stride_;
};

/// Average pooling with a square window; stride defaults to the window size.
struct avg_pool2d {
  int64_t kernel_size;
  explicit avg_pool2d(int64_t kernel) : kernel_size(kernel), stride_(kernel) {}
  avg_pool2d& stride(int64_t s) { stride_ = s; return *this; }
  int64_t stride() const { return stride_; }
  std::unique_ptr<model::layer> make() const;

private:
  int64_t stride_;
};

/// Averages each channel of [c, h, w] over its plane: the output is [c].
struct global_avg_pool { std::unique_ptr<model::layer> make() const; };

struct relu { std::unique_ptr<model::layer> make() const; };
struct tanh { std::unique_ptr<model::layer> make() const; };
struct sigmoid { std::unique_ptr<model::layer> make() const; };
/// Collapses [c, h, w] into [c*h*w].
struct flatten { std::unique_ptr<model::layer> make() const; };

/// Inverted dropout with drop probability p (identity at evaluation).
struct dropout {
  float p;
  explicit dropout(float prob = 0.5f) : p(prob) {}
  std::unique_ptr<model::layer> make() const;
};

/// Batch normalization per channel of [c] or [c, h, w] inputs.
struct batch_norm {
  int64_t features;
  explicit batch_norm(int64_t f) : features(f) {}
  batch_norm& eps(float e) { eps_ = e; return *this; }
  batch_norm& momentum(float m) { momentum_ = m; return *this; }
  float eps() const { return eps_; }
  float momentum() const { return momentum_; }
  std::unique_ptr<model::layer> make() const;

private:
  float eps_ = 1e-5f, momentum_ = 0.1f;
};

/// A residual block: output = body(x) + shortcut(x). The body is the layers
/// given, in order; the shortcut is the identity, or the layers given to
/// projection() (for a body that changes the shape):
///
///   residual(conv2d(16, 32, 3).stride(2).padding(1).bias(false), batch_norm(32), relu(),
///            conv2d(32, 32, 3).padding(1).bias(false), batch_norm(32))
///       .projection(conv2d(16, 32, 1).stride(2).bias(false), batch_norm(32))
///
/// A block is one layer of the model's chain; its parameters are named after
/// the block and the layer inside it ("3.residual.0.conv2d.weight",
/// "3.residual.projection.0.conv2d.weight").
struct residual {
  using layer_factory = std::function<std::unique_ptr<model::layer>()>;
  std::vector<layer_factory> body, shortcut;

  template <class... Layers>
  explicit residual(const Layers&... layers) {
    static_assert(sizeof...(Layers) > 0, "residual(...) needs at least one layer");
    (body.push_back(factory(layers)), ...);
  }
  /// The shortcut's layers (instead of the identity).
  template <class... Layers>
  residual& projection(const Layers&... layers) {
    static_assert(sizeof...(Layers) > 0, "projection(...) needs at least one layer");
    shortcut.clear();
    (shortcut.push_back(factory(layers)), ...);
    return *this;
  }
  std::unique_ptr<model::layer> make() const;

private:
  template <class L>
  static layer_factory factory(const L& l) {
    return [l] { return l.make(); };
  }
};

/// A model that applies `layers` in order.
template <class... Layers>
model::model sequential(const Layers&... layers) {
  std::vector<std::unique_ptr<model::layer>> v;
  v.reserve(sizeof...(Layers));
  (v.push_back(layers.make()), ...);
  return model::model(std::move(v));
}

// ---------------------------------------------------------------- sequences
// Layers of GPT-style language models (kernels/sequence.hpp). A sample is a
// sequence: [T] token ids (floats holding exact integers: the model input is a
// float tensor), or [T, C] features; the batch adds the first dimension.

/// Token embedding: [T] token ids -> [T, dim], row `id` of a learned table
/// [vocab, dim] (parameter "weight", drawn from N(0, 0.02^2)). Every id must be
/// an integer in [0, vocab): forward throws troupe::error naming the bad one.
/// Tokens are discrete: the layer gives no gradient of its input (zeros when a
/// stage after the first asks for one).
struct embedding {
  int64_t vocab, dim;
  embedding(int64_t v, int64_t d) : vocab(v), dim(d) {}
  std::unique_ptr<model::layer> make() const;
};

/// Learned position embedding: [T, dim] -> the same plus rows 0..T-1 of a table
/// [max_len, dim] (parameter "weight", drawn from N(0, 0.02^2)). T > max_len is
/// an error at build time (and in forward).
struct positional_embedding {
  int64_t max_len, dim;
  positional_embedding(int64_t max_length, int64_t d) : max_len(max_length), dim(d) {}
  std::unique_ptr<model::layer> make() const;
};

/// Layer normalization over the last dimension (of size `features`): y =
/// (x - mean) / sqrt(var + eps) * gamma + beta; gamma starts at 1, beta at 0.
struct layer_norm {
  int64_t features;
  explicit layer_norm(int64_t f) : features(f) {}
  layer_norm& eps(float e) { eps_ = e; return *this; }
  float eps() const { return eps_; }
  std::unique_ptr<model::layer> make() const;

private:
  float eps_ = 1e-5f;
};

/// GELU, GPT-2's tanh approximation, elementwise.
struct gelu { std::unique_ptr<model::layer> make() const; };

/// A fully connected layer over the last dimension: [..., in] -> [..., out],
/// every leading position a row (y = x W^T + b, W [out, in], parameters
/// "weight" and "bias" as dense's). dense() keeps asking for a flat input, so
/// that an image model that forgets flatten() is still told so.
/// Initialisation is Xavier by default (transformers have no ReLU).
struct sequence_dense {
  int64_t in_features, out_features;
  sequence_dense(int64_t in, int64_t out) : in_features(in), out_features(out) {}
  sequence_dense& bias(bool b) { bias_ = b; return *this; }
  sequence_dense& init(init_scheme s) { init_ = s; return *this; }
  /// Multiplies the initial weights' spread (GPT-2 scales the projections
  /// that feed a residual sum by 1 / sqrt(2 x blocks)).
  sequence_dense& init_scale(float f) { init_scale_ = f; return *this; }
  bool bias() const { return bias_; }
  init_scheme init() const { return init_; }
  float init_scale() const { return init_scale_; }
  std::unique_ptr<model::layer> make() const;

private:
  bool bias_ = true;
  init_scheme init_ = init_scheme::xavier;
  float init_scale_ = 1.0f;
};

/// Causal multi-head self-attention over [T, dim]: a fused projection to
/// queries, keys and values (parameters "qkv.weight" [3 dim, dim], "qkv.bias"
/// [3 dim]), the attention core (position t attends to positions <= t), and an
/// output projection ("proj.weight" [dim, dim], "proj.bias" [dim]). dim must
/// be a multiple of heads. No dropout (put a dropout() after it if needed).
struct causal_self_attention {
  int64_t dim, heads;
  causal_self_attention(int64_t d, int64_t h) : dim(d), heads(h) {}
  /// The projections' initialisation (default Xavier), and a factor on the
  /// output projection's spread (as sequence_dense::init_scale).
  causal_self_attention& init(init_scheme s) { init_ = s; return *this; }
  causal_self_attention& proj_scale(float f) { proj_scale_ = f; return *this; }
  init_scheme init() const { return init_; }
  float proj_scale() const { return proj_scale_; }
  std::unique_ptr<model::layer> make() const;

private:
  init_scheme init_ = init_scheme::xavier;
  float proj_scale_ = 1.0f;
};

/// A pre-norm GPT block over [T, dim], one layer of the chain made of two
/// residual blocks:
///   residual(layer_norm(dim), causal_self_attention(dim, heads)),
///   residual(layer_norm(dim), sequence_dense(dim, mlp_ratio * dim), gelu(),
///            sequence_dense(mlp_ratio * dim, dim)).
/// Parameters are named after the residual and the layer inside it:
/// "2.transformer_block.0.residual.1.causal_self_attention.qkv.weight",
/// "2.transformer_block.1.residual.3.sequence_dense.bias".
struct transformer_block {
  int64_t dim, heads, mlp_ratio;
  transformer_block(int64_t d, int64_t h, int64_t ratio = 4) : dim(d), heads(h), mlp_ratio(ratio) {}
  /// Its linears' initialisation (default Xavier), and the factor on the
  /// spread of the two that feed the residual sums (the attention's output
  /// projection, the MLP's second layer).
  transformer_block& init(init_scheme s) { init_ = s; return *this; }
  transformer_block& residual_scale(float f) { residual_scale_ = f; return *this; }
  init_scheme init() const { return init_; }
  float residual_scale() const { return residual_scale_; }
  std::unique_ptr<model::layer> make() const;

private:
  init_scheme init_ = init_scheme::xavier;
  float residual_scale_ = 1.0f;
};

} // namespace troupe::nn
