// The sequence layers behind the DSL of model/nn.hpp: token and position
// embeddings, layer norm, GELU, dense over the last dimension, causal
// self-attention. Their kernels are in kernels/sequence.hpp.
#include <cmath>
#include <sstream>

#include "kernels/kernels.hpp"
#include "kernels/sequence.hpp"
#include "model/init.hpp"
#include "model/nn.hpp"

namespace troupe::model {

namespace {

namespace k = troupe::kernels;

std::string n2s(int64_t v) { return std::to_string(v); }

/// The standard deviation of GPT-2's embedding initialisation.
constexpr float embedding_sd = 0.02f;

/// A gradient of the parameter's shape, for kernels that need it allocated.
void ensure_grad(parameter& p) {
  if (!p.grad.defined() || p.grad.shape() != p.value.shape()) p.grad = tensor::zeros(p.value.shape());
}

/// `s` with its last dimension replaced by `last`.
shape with_last(const shape& s, int64_t last) {
  std::vector<int64_t> d = s.dims();
  d.back() = last;
  return shape(d);
}

/// A view of x as rows of its last dimension: [numel / last, last].
tensor as_rows(const tensor& x) { return x.reshape({x.numel() / x.dim(x.rank() - 1), x.dim(x.rank() - 1)}); }

void require_positive(const std::string& what, std::initializer_list<int64_t> sizes) {
  for (int64_t v : sizes)
    if (v <= 0) throw error(what + ": sizes must be positive");
}

/// Checks a per-sample shape [..., features] (rank >= min_rank).
void require_features(const shape& in, int64_t features, std::size_t min_rank, const std::string& source,
                      const std::string& layout) {
  if (in.rank() < min_rank || in[in.rank() - 1] != features)
    throw shape_error("expects " + layout + " with " + n2s(features) + " features last, " + source + " gives " +
                      in.to_string());
}

class embedding_layer final : public layer {
public:
  explicit embedding_layer(const nn::embedding& o) : o_(o) {
    require_positive(describe(), {o.vocab, o.dim});
  }
  std::string kind() const override { return "embedding"; }
  std::string describe() const override { return "embedding(" + n2s(o_.vocab) + " -> " + n2s(o_.dim) + ")"; }
  shape infer(const shape& in, const std::string& source) override {
    if (in.rank() != 1)
      throw shape_error("expects [time] token ids per sample, " + source + " gives " + in.to_string());
    return {in[0], o_.dim};
  }
  void initialize(std::mt19937_64& rng) override {
    w_.value = tensor::empty({o_.vocab, o_.dim});
    init_normal(w_.value, embedding_sd, rng);
  }
  const tensor& forward(const k::context& ctx, const tensor& x, bool) override {
    x_shape_ = x.shape();
    read_ids(x);
    k::embedding_forward(ctx, k::token_ids::of(ids_, x.dim(0)), w_.value, y_);
    return y_;
  }
  const tensor& backward(const k::context& ctx, const tensor& dy) override {
    ensure_grad(w_);
    k::embedding_backward(ctx, k::token_ids::of(ids_, x_shape_[0]), dy, w_.grad);
    dx_ = needs_input_grad_ ? tensor::zeros(x_shape_) : tensor();  // ids are discrete
    return dx_;
  }
  std::vector<parameter*> parameters() override { return {&w_}; }
  int64_t input_ids() const override { return o_.vocab; }

private:
  /// The ids of x [B, T], each checked to be an integer in [0, vocab).
  void read_ids(const tensor& x) {
    if (x.rank() != 2) throw shape_error(describe() + ": expects token ids [batch, time], got " + x.shape().to_string());
    ids_.resize(static_cast<std::size_t>(x.numel()));
    const float* p = x.data();
    for (int64_t i = 0; i < x.numel(); ++i) {
      if (!(p[i] >= 0.0f && p[i] < static_cast<float>(o_.vocab) && p[i] == std::floor(p[i]))) {
        std::ostringstream os;
        os.precision(9);
        os << describe() << ": token id " << p[i] << " at batch " << i / x.dim(1) << ", position " << i % x.dim(1)
           << " is not an integer in [0, " << o_.vocab << ")";
        throw error(os.str());
      }
      ids_[static_cast<std::size_t>(i)] = static_cast<int32_t>(p[i]);
    }
  }

  nn::embedding o_;
  parameter w_{"weight", {}, {}};
  std::vector<int32_t> ids_;
  shape x_shape_;
  tensor y_, dx_;
};

class positional_embedding_layer final : public layer {
public:
  explicit positional_embedding_layer(const nn::positional_embedding& o) : o_(o) {
    require_positive(describe(), {o.max_len, o.dim});
  }
  std::string kind() const override { return "positional_embedding"; }
  std::string describe() const override {
    return "positional_embedding(" + n2s(o_.max_len) + " x " + n2s(o_.dim) + ")";
  }
  shape infer(const shape& in, const std::string& source) override {
    require_features(in, o_.dim, 2, source, "[time, features]");
    if (in.rank() != 2 || in[0] > o_.max_len)
      throw shape_error("expects [time, " + n2s(o_.dim) + "] with time <= " + n2s(o_.max_len) +
                        " (its max_len), " + source + " gives " + in.to_string());
    return in;
  }
  void initialize(std::mt19937_64& rng) override {
    w_.value = tensor::empty({o_.max_len, o_.dim});
    init_normal(w_.value, embedding_sd, rng);
  }
  const tensor& forward(const k::context& ctx, const tensor& x, bool) override {
    if (x.rank() != 3 || x.dim(1) > o_.max_len || x.dim(2) != o_.dim)
      throw shape_error(describe() + ": expects [batch, time <= " + n2s(o_.max_len) + ", " + n2s(o_.dim) +
                        "], got " + x.shape().to_string());
    if (!y_.defined() || y_.shape() != x.shape() || y_.shares_storage(x)) y_ = tensor::empty(x.shape());
    y_.copy_from(x);
    k::position_embedding_forward(ctx, w_.value, y_);
    return y_;
  }
  const tensor& backward(const k::context& ctx, const tensor& dy) override {
    ensure_grad(w_);
    k::position_embedding_backward(ctx, dy, w_.grad);
    return dy;  // d(x + table)/dx is the identity
  }
  std::vector<parameter*> parameters() override { return {&w_}; }

private:
  nn::positional_embedding o_;
  parameter w_{"weight", {}, {}};
  tensor y_;
};

class layer_norm_layer final : public layer {
public:
  explicit layer_norm_layer(const nn::layer_norm& o) : o_(o) {
    require_positive(describe(), {o.features});
    if (!(o.eps() > 0.0f)) throw error(describe() + ": eps must be > 0");
  }
  std::string kind() const override { return "layer_norm"; }
  std::string describe() const override { return "layer_norm(" + n2s(o_.features) + ")"; }
  shape infer(const shape& in, const std::string& source) override {
    require_features(in, o_.features, 1, source, "inputs");
    return in;
  }
  void initialize(std::mt19937_64&) override {
    gamma_.value = tensor::full({o_.features}, 1.0f);
    beta_.value = tensor::zeros({o_.features});
  }
  const tensor& forward(const k::context& ctx, const tensor& x, bool) override {
    x_ = x;
    k::layer_norm_forward(ctx, x, gamma_.value, beta_.value, o_.eps(), y_, mean_, rstd_);
    return y_;
  }
  const tensor& backward(const k::context& ctx, const tensor& dy) override {
    k::layer_norm_backward(ctx, x_, gamma_.value, mean_, rstd_, dy, dx_, gamma_.grad, beta_.grad);
    return dx_;
  }
  std::vector<parameter*> parameters() override { return {&gamma_, &beta_}; }

private:
  nn::layer_norm o_;
  parameter gamma_{"gamma", {}, {}}, beta_{"beta", {}, {}};
  tensor x_, y_, dx_, mean_, rstd_;
};

class gelu_layer final : public layer {
public:
  std::string kind() const override { return "gelu"; }
  std::string describe() const override { return "gelu"; }
  shape infer(const shape& in, const std::string&) override { return in; }
  const tensor& forward(const k::context& ctx, const tensor& x, bool) override {
    x_ = x;
    k::gelu_forward(ctx, x, y_);
    return y_;
  }
  const tensor& backward(const k::context& ctx, const tensor& dy) override {
    k::gelu_backward(ctx, x_, dy, dx_);
    return dx_;
  }

private:
  tensor x_, y_, dx_;
};

/// y = x W^T + b over the rows of a [rows, in] view; the weights a sequence
/// dense layer and the attention's projections share.
struct row_dense {
  parameter w, b;
  bool bias = true;
  tensor x2, y2, dx2;

  void initialize(int64_t in, int64_t out, init_scheme s, std::mt19937_64& rng, float scale = 1.0f) {
    w.value = tensor::empty({out, in});
    init_weights(w.value, in, out, s, rng, scale);
    if (bias) b.value = tensor::zeros({out});
  }
  /// y (viewed with x's leading dimensions) for x [..., in].
  tensor forward(const k::context& ctx, const tensor& x) {
    x2 = as_rows(x);
    k::dense_forward(ctx, x2, w.value, b.value, y2);
    return y2.reshape(with_last(x.shape(), w.value.dim(0)));
  }
  /// dx (viewed as the forward pass's x), undefined when not wanted.
  tensor backward(const k::context& ctx, const tensor& dy, const shape& x_shape, bool want_dx) {
    k::dense_backward(ctx, x2, w.value, as_rows(dy), want_dx ? &dx2 : nullptr, w.grad, bias ? &b.grad : nullptr);
    return want_dx ? dx2.reshape(x_shape) : tensor();
  }
  void collect(std::vector<parameter*>& out) {
    out.push_back(&w);
    if (bias) out.push_back(&b);
  }
};

class sequence_dense_layer final : public layer {
public:
  explicit sequence_dense_layer(const nn::sequence_dense& o) : o_(o) {
    require_positive("sequence_dense(" + n2s(o.in_features) + ", " + n2s(o.out_features) + ")",
                     {o.in_features, o.out_features});
    d_.w.name = "weight";
    d_.b.name = "bias";
    d_.bias = o.bias();
  }
  std::string kind() const override { return "sequence_dense"; }
  std::string describe() const override {
    return "sequence_dense(" + n2s(o_.in_features) + " -> " + n2s(o_.out_features) +
           (o_.bias() ? "" : ", no bias") + ")";
  }
  shape infer(const shape& in, const std::string& source) override {
    require_features(in, o_.in_features, 1, source, "inputs");
    return with_last(in, o_.out_features);
  }
  void initialize(std::mt19937_64& rng) override {
    d_.initialize(o_.in_features, o_.out_features, o_.init(), rng, o_.init_scale());
  }
  const tensor& forward(const k::context& ctx, const tensor& x, bool) override {
    x_shape_ = x.shape();
    y_ = d_.forward(ctx, x);
    return y_;
  }
  const tensor& backward(const k::context& ctx, const tensor& dy) override {
    dx_ = d_.backward(ctx, dy, x_shape_, needs_input_grad_);
    return dx_;
  }
  std::vector<parameter*> parameters() override {
    std::vector<parameter*> v;
    d_.collect(v);
    return v;
  }

private:
  nn::sequence_dense o_;
  row_dense d_;
  shape x_shape_;
  tensor y_, dx_;
};

class causal_self_attention_layer final : public layer {
public:
  explicit causal_self_attention_layer(const nn::causal_self_attention& o) : o_(o) {
    require_positive(describe(), {o.dim, o.heads});
    if (o.dim % o.heads != 0) throw error(describe() + ": dim must be a multiple of heads");
    qkv_.w.name = "qkv.weight";
    qkv_.b.name = "qkv.bias";
    proj_.w.name = "proj.weight";
    proj_.b.name = "proj.bias";
  }
  std::string kind() const override { return "causal_self_attention"; }
  std::string describe() const override {
    return "causal_self_attention(" + n2s(o_.dim) + ", " + n2s(o_.heads) + " heads)";
  }
  shape infer(const shape& in, const std::string& source) override {
    require_features(in, o_.dim, 2, source, "[time, features]");
    if (in.rank() != 2) throw shape_error("expects [time, " + n2s(o_.dim) + "], " + source + " gives " + in.to_string());
    return in;
  }
  void initialize(std::mt19937_64& rng) override {
    qkv_.initialize(o_.dim, 3 * o_.dim, o_.init(), rng);
    proj_.initialize(o_.dim, o_.dim, o_.init(), rng, o_.proj_scale());
  }
  const tensor& forward(const k::context& ctx, const tensor& x, bool) override {
    x_shape_ = x.shape();
    qkv_out_ = qkv_.forward(ctx, x);
    k::attention_forward(ctx, qkv_out_, o_.heads, att_, probs_);
    y_ = proj_.forward(ctx, att_);
    return y_;
  }
  const tensor& backward(const k::context& ctx, const tensor& dy) override {
    const tensor datt = proj_.backward(ctx, dy, att_.shape(), true);
    k::attention_backward(ctx, qkv_out_, probs_, datt, dqkv_);
    dx_ = qkv_.backward(ctx, dqkv_, x_shape_, needs_input_grad_);
    return dx_;
  }
  std::vector<parameter*> parameters() override {
    std::vector<parameter*> v;
    qkv_.collect(v);
    proj_.collect(v);
    return v;
  }

private:
  nn::causal_self_attention o_;
  row_dense qkv_, proj_;
  shape x_shape_;
  tensor qkv_out_, att_, probs_, y_, dqkv_, dx_;
};

} // namespace

} // namespace troupe::model

namespace troupe::nn {

using model::layer;

std::unique_ptr<layer> embedding::make() const { return std::make_unique<model::embedding_layer>(*this); }
std::unique_ptr<layer> positional_embedding::make() const {
  return std::make_unique<model::positional_embedding_layer>(*this);
}
std::unique_ptr<layer> layer_norm::make() const { return std::make_unique<model::layer_norm_layer>(*this); }
std::unique_ptr<layer> gelu::make() const { return std::make_unique<model::gelu_layer>(); }
std::unique_ptr<layer> sequence_dense::make() const { return std::make_unique<model::sequence_dense_layer>(*this); }
std::unique_ptr<layer> causal_self_attention::make() const {
  return std::make_unique<model::causal_self_attention_layer>(*this);
}

} // namespace troupe::nn
