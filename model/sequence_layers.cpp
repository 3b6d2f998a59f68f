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

/// A call's input, kept for the backward pass.
struct input_state : layer_state {
  tensor x;
};

struct embedding_state : layer_state {
  std::vector<int32_t> ids;  // the input's, checked
  shape x_shape;
};

class embedding_layer final : public layer_with_state<embedding_state> {
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
  const tensor& run_forward(const k::context& ctx, const tensor& x, bool, embedding_state& s) override {
    s.x_shape = x.shape();
    read_ids(x, s.ids);
    k::embedding_forward(ctx, k::token_ids::of(s.ids, x.dim(0)), w_.value, s.y);
    return s.y;
  }
  const tensor& run_backward(const k::context& ctx, const tensor& dy, embedding_state& s) override {
    ensure_grad(w_);
    k::embedding_backward(ctx, k::token_ids::of(s.ids, s.x_shape[0]), dy, w_.grad);
    if (!needs_input_grad_) {
      s.dx = tensor();
    } else {  // ids are discrete
      if (!s.dx.defined() || s.dx.shape() != s.x_shape) s.dx = tensor::empty(s.x_shape);
      s.dx.fill(0.0f);
    }
    return s.dx;
  }
  bool decodes() const override { return true; }
  std::vector<parameter*> parameters() override { return {&w_}; }
  int64_t input_ids() const override { return o_.vocab; }

private:
  /// The ids of x [B, T], each checked to be an integer in [0, vocab).
  void read_ids(const tensor& x, std::vector<int32_t>& ids) const {
    if (x.rank() != 2) throw shape_error(describe() + ": expects token ids [batch, time], got " + x.shape().to_string());
    ids.resize(static_cast<std::size_t>(x.numel()));
    const float* p = x.data();
    for (int64_t i = 0; i < x.numel(); ++i) {
      if (!(p[i] >= 0.0f && p[i] < static_cast<float>(o_.vocab) && p[i] == std::floor(p[i]))) {
        std::ostringstream os;
        os.precision(9);
        os << describe() << ": token id " << p[i] << " at batch " << i / x.dim(1) << ", position " << i % x.dim(1)
           << " is not an integer in [0, " << o_.vocab << ")";
        throw error(os.str());
      }
      ids[static_cast<std::size_t>(i)] = static_cast<int32_t>(p[i]);
    }
  }

  nn::embedding o_;
  parameter w_{"weight", {}, {}};
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
  const tensor& forward(const k::context& ctx, const tensor& x, bool, layer_state& s) override {
    return decode(ctx, x, 0, s);
  }
  /// Positions [start, start + time) take rows [start, start + time) of the table.
  const tensor& decode(const k::context& ctx, const tensor& x, int64_t start, layer_state& s) override {
    if (x.rank() != 3 || start < 0 || x.dim(1) > o_.max_len - start || x.dim(2) != o_.dim)
      throw shape_error(describe() + ": expects [batch, time <= " + n2s(o_.max_len) +
                        (start > 0 ? " - " + n2s(start) + " (the positions before it)" : std::string()) + ", " +
                        n2s(o_.dim) + "], got " + x.shape().to_string());
    if (!s.y.defined() || s.y.shape() != x.shape() || s.y.shares_storage(x)) s.y = tensor::empty(x.shape());
    s.y.copy_from(x);
    k::position_embedding_forward(ctx, w_.value, s.y, start);
    return s.y;
  }
  bool decodes() const override { return true; }
  const tensor& backward(const k::context& ctx, const tensor& dy, layer_state&) override {
    ensure_grad(w_);
    k::position_embedding_backward(ctx, dy, w_.grad);
    return dy;  // d(x + table)/dx is the identity
  }
  std::vector<parameter*> parameters() override { return {&w_}; }

private:
  nn::positional_embedding o_;
  parameter w_{"weight", {}, {}};
};

struct layer_norm_state : layer_state {
  tensor x, mean, rstd;  // its input, and each row's statistics
};

class layer_norm_layer final : public layer_with_state<layer_norm_state> {
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
  const tensor& run_forward(const k::context& ctx, const tensor& x, bool, layer_norm_state& s) override {
    s.x = x;
    k::layer_norm_forward(ctx, x, gamma_.value, beta_.value, o_.eps(), s.y, s.mean, s.rstd);
    return s.y;
  }
  const tensor& run_backward(const k::context& ctx, const tensor& dy, layer_norm_state& s) override {
    k::layer_norm_backward(ctx, s.x, gamma_.value, s.mean, s.rstd, dy, s.dx, gamma_.grad, beta_.grad);
    return s.dx;
  }
  bool decodes() const override { return true; }
  std::vector<parameter*> parameters() override { return {&gamma_, &beta_}; }

private:
  nn::layer_norm o_;
  parameter gamma_{"gamma", {}, {}}, beta_{"beta", {}, {}};
};

class gelu_layer final : public layer_with_state<input_state> {
public:
  std::string kind() const override { return "gelu"; }
  std::string describe() const override { return "gelu"; }
  shape infer(const shape& in, const std::string&) override { return in; }
  const tensor& run_forward(const k::context& ctx, const tensor& x, bool, input_state& s) override {
    s.x = x;
    k::gelu_forward(ctx, x, s.y);
    return s.y;
  }
  const tensor& run_backward(const k::context& ctx, const tensor& dy, input_state& s) override {
    k::gelu_backward(ctx, s.x, dy, s.dx);
    return s.dx;
  }
  bool decodes() const override { return true; }
};

/// y = x W^T + b over the rows of a [rows, in] view; the weights a sequence
/// dense layer and the attention's projections share. A call's buffers are
/// the caller's.
struct row_dense {
  parameter w, b;
  bool bias = true;

  void initialize(int64_t in, int64_t out, init_scheme s, std::mt19937_64& rng, float scale = 1.0f) {
    w.value = tensor::empty({out, in});
    init_weights(w.value, in, out, s, rng, scale);
    if (bias) b.value = tensor::zeros({out});
  }
  /// y [..., out] for x [..., in], written into `y` when it has that shape (k::ensure_shape).
  void forward(const k::context& ctx, const tensor& x, tensor& y) const {
    k::ensure_shape(y, with_last(x.shape(), w.value.dim(0)));
    tensor y2 = as_rows(y);
    k::dense_forward(ctx, as_rows(x), w.value, b.value, y2);
  }
  /// dx, of the shape of the forward pass's input x, written into `dx` when
  /// it has that shape; undefined when not wanted.
  void backward(const k::context& ctx, const tensor& x, const tensor& dy, bool want_dx, tensor& dx) {
    tensor dx2;
    if (want_dx) {
      k::ensure_shape(dx, x.shape());
      dx2 = as_rows(dx);
    } else {
      dx = tensor();
    }
    k::dense_backward(ctx, as_rows(x), w.value, as_rows(dy), want_dx ? &dx2 : nullptr, w.grad,
                      bias ? &b.grad : nullptr);
  }
  void collect(std::vector<parameter*>& out) {
    out.push_back(&w);
    if (bias) out.push_back(&b);
  }
};

class sequence_dense_layer final : public layer_with_state<input_state> {
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
  const tensor& run_forward(const k::context& ctx, const tensor& x, bool, input_state& s) override {
    s.x = x;
    d_.forward(ctx, x, s.y);
    return s.y;
  }
  const tensor& run_backward(const k::context& ctx, const tensor& dy, input_state& s) override {
    d_.backward(ctx, s.x, dy, needs_input_grad_, s.dx);
    return s.dx;
  }
  bool decodes() const override { return true; }  // row by row
  std::vector<parameter*> parameters() override {
    std::vector<parameter*> v;
    d_.collect(v);
    return v;
  }

private:
  nn::sequence_dense o_;
  row_dense d_;
};

struct attention_state : layer_state {
  tensor x, qkv, att, probs;  // its input, the projection, the heads' outputs and their softmax
  // Decoding: the qkv rows of the positions decoded so far ([capacity, 3C], rows [0, decoded) set).
  tensor cache;
  int64_t decoded = 0;
};

class causal_self_attention_layer final : public layer_with_state<attention_state> {
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
  const tensor& run_forward(const k::context& ctx, const tensor& x, bool, attention_state& s) override {
    s.x = x;
    qkv_.forward(ctx, x, s.qkv);
    k::attention_forward(ctx, s.qkv, o_.heads, s.att, s.probs);
    proj_.forward(ctx, s.att, s.y);
    return s.y;
  }
  /// The new positions' queries, keys and values join those of the positions before them in the
  /// state's cache; the new queries attend to every cached key up to their own position.
  const tensor& decode(const k::context& ctx, const tensor& x, int64_t start, layer_state& st) override {
    auto& s = static_cast<attention_state&>(st);
    if (x.rank() != 3 || x.dim(0) != 1 || x.dim(2) != o_.dim)
      throw shape_error(describe() + ": decodes one sequence [1, time, " + n2s(o_.dim) + "], got " +
                        x.shape().to_string());
    if (start < 0 || start > s.decoded)
      throw error(describe() + ": cannot decode from position " + n2s(start) + ": its state holds the " +
                  n2s(s.decoded) + " positions before it");
    const int64_t n = x.dim(1), ld = 3 * o_.dim;
    qkv_.forward(ctx, x, s.qkv);
    if (!s.cache.defined() || s.cache.dim(0) < start + n) {  // grows by doubling, keeps rows [0, start)
      tensor grown = tensor::empty({std::max<int64_t>(start + n, 2 * (s.cache.defined() ? s.cache.dim(0) : 16)), ld});
      if (start > 0) std::copy(s.cache.data(), s.cache.data() + start * ld, grown.data());
      s.cache = std::move(grown);
    }
    std::copy(s.qkv.data(), s.qkv.data() + n * ld, s.cache.data() + start * ld);
    s.decoded = start + n;
    if (start == 0) k::attention_forward(ctx, s.qkv, o_.heads, s.att, s.probs);  // a whole sequence: its kernel
    else k::attention_decode(ctx, s.cache, start, n, o_.heads, s.att, s.probs);
    proj_.forward(ctx, s.att, s.y);
    return s.y;
  }
  bool decodes() const override { return true; }
  const tensor& run_backward(const k::context& ctx, const tensor& dy, attention_state& s) override {
    proj_.backward(ctx, s.att, dy, true, datt_);
    k::attention_backward(ctx, s.qkv, s.probs, datt_, dqkv_);
    qkv_.backward(ctx, s.x, dqkv_, needs_input_grad_, s.dx);
    return s.dx;
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
  tensor datt_, dqkv_;  // scratch of a backward pass, kept by no call
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
