// The layers behind the DSL of model/nn.hpp.
#include <cmath>
#include <sstream>

#include "kernels/kernels.hpp"
#include "model/init.hpp"
#include "model/nn.hpp"

namespace troupe::model {

namespace {

namespace k = troupe::kernels;

std::string n2s(int64_t v) { return std::to_string(v); }

/// Batch shape: [n] + per-sample shape.
shape batched(int64_t n, const shape& s) {
  std::vector<int64_t> d{n};
  d.insert(d.end(), s.dims().begin(), s.dims().end());
  return shape(d);
}

shape per_sample(const shape& s) {
  return shape(std::vector<int64_t>(s.dims().begin() + 1, s.dims().end()));
}

/// A call's input, kept for the backward pass.
struct input_state : layer_state {
  tensor x;
};

class dense_layer final : public layer_with_state<input_state> {
public:
  explicit dense_layer(const nn::dense& o) : o_(o) {
    if (o.in_features <= 0 || o.out_features <= 0)
      throw error("dense(" + n2s(o.in_features) + ", " + n2s(o.out_features) + "): sizes must be positive");
  }
  std::string kind() const override { return "dense"; }
  std::string describe() const override {
    return "dense(" + n2s(o_.in_features) + " -> " + n2s(o_.out_features) + (o_.bias() ? "" : ", no bias") + ")";
  }
  shape infer(const shape& in, const std::string& source) override {
    if (in.rank() != 1)
      throw shape_error("expects a flat input of " + n2s(o_.in_features) + " features, " + source +
                        " gives shape " + in.to_string() + " (add flatten() before it)");
    if (in[0] != o_.in_features)
      throw shape_error("expects " + n2s(o_.in_features) + " inputs, " + source + " gives " + n2s(in[0]));
    return {o_.out_features};
  }
  void initialize(std::mt19937_64& rng) override {
    w_.value = tensor::empty({o_.out_features, o_.in_features});
    init_weights(w_.value, o_.in_features, o_.out_features, o_.init(), rng);
    if (o_.bias()) b_.value = tensor::zeros({o_.out_features});
  }
  bool fuse_next(const layer* next) override {
    relu_ = next && next->kind() == "relu";
    return relu_;
  }
  const tensor& run_forward(const k::context& ctx, const tensor& x, bool, input_state& s) override {
    s.x = x;
    k::dense_forward(ctx, x, w_.value, b_.value, s.y, relu_);
    return s.y;
  }
  const tensor& run_backward(const k::context& ctx, const tensor& dy, input_state& s) override {
    k::dense_backward(ctx, s.x, w_.value, dy, needs_input_grad_ ? &s.dx : nullptr, w_.grad,
                      o_.bias() ? &b_.grad : nullptr, relu_ ? &s.y : nullptr);
    if (!needs_input_grad_) s.dx = tensor();
    return s.dx;
  }
  std::vector<parameter*> parameters() override {
    std::vector<parameter*> v{&w_};
    if (o_.bias()) v.push_back(&b_);
    return v;
  }

private:
  nn::dense o_;
  parameter w_{"weight", {}, {}}, b_{"bias", {}, {}};
  bool relu_ = false;  // applies the next layer, a ReLU
};

struct conv2d_state : layer_state {
  tensor x, cols;  // its input, and im2col's column matrices
  const tensor* map = nullptr;  // what x is read through (input_map), or null
  tensor mapped;  // the mapped input, made where the fused pool's kernels take none
  // With a 2x2 max pool applied (y is then the pool's output):
  bool pooled = false;  // by the fused kernels, and `window` holds the maxima's places
  tensor window;
  tensor conv_y, spread;  // otherwise: the convolution's output, the pool's gradient spread over it
  std::vector<int32_t> argmax;
};

class conv2d_layer final : public layer_with_state<conv2d_state> {
public:
  explicit conv2d_layer(const nn::conv2d& o) : o_(o) {
    g_.in_channels = o.in_channels;
    g_.out_channels = o.out_channels;
    g_.kernel = o.kernel_size;
    g_.stride = o.stride();
    g_.padding = o.padding();
    if (o.in_channels <= 0 || o.out_channels <= 0 || o.kernel_size <= 0 || o.stride() <= 0 || o.padding() < 0)
      throw error(describe() + ": channels, kernel and stride must be positive, padding non-negative");
  }
  std::string kind() const override { return "conv2d"; }
  std::string describe() const override {
    std::ostringstream os;
    os << "conv2d(" << o_.in_channels << " -> " << o_.out_channels << ", " << o_.kernel_size << "x"
       << o_.kernel_size;
    if (o_.stride() != 1) os << ", stride " << o_.stride();
    if (o_.padding() != 0) os << ", pad " << o_.padding();
    os << ")";
    return os.str();
  }
  shape infer(const shape& in, const std::string& source) override {
    if (in.rank() != 3)
      throw shape_error("expects [channels, height, width] inputs, " + source + " gives " + in.to_string());
    if (in[0] != o_.in_channels)
      throw shape_error("expects " + n2s(o_.in_channels) + " input channels, " + source + " gives " +
                        n2s(in[0]) + " (shape " + in.to_string() + ")");
    try {
      return per_sample(k::conv2d_output_shape(batched(1, in), g_));
    } catch (const shape_error& e) {
      throw shape_error(std::string(e.what()) + "; " + source + " gives " + in.to_string());
    }
  }
  void initialize(std::mt19937_64& rng) override {
    const int64_t kk = o_.kernel_size * o_.kernel_size;
    w_.value = tensor::empty({o_.out_channels, o_.in_channels, o_.kernel_size, o_.kernel_size});
    init_weights(w_.value, o_.in_channels * kk, o_.out_channels * kk, o_.init(), rng);
    if (o_.bias()) b_.value = tensor::zeros({o_.out_channels});
  }
  bool fuse_next(const layer* next) override {
    relu_ = next && next->kind() == "relu";
    pool_ = false;
    return relu_;
  }
  bool fuse_also(const layer* after) override;
  bool takes_input_map() const override { return true; }
  const tensor& run_forward(const k::context& ctx, const tensor& x, bool, conv2d_state& s) override {
    s.x = x;
    s.map = s.input_map;
    if (s.map && pool_) {  // the pooled kernels read no map: the mapped input made first
      k::channel_affine_relu(ctx, x, *s.map, s.mapped);
      s.x = s.mapped;
      s.map = nullptr;
    }
    s.pooled = pool_ && k::conv2d_relu_pool_supported(ctx, g_);
    if (s.pooled) {  // the convolution's output never written
      s.cols = tensor();
      k::conv2d_relu_pool_forward(ctx, s.x, w_.value, b_.value, g_, s.y, s.window);
      return s.y;
    }
    k::conv2d_forward(ctx, s.x, w_.value, b_.value, g_, pool_ ? s.conv_y : s.y, s.cols, relu_, s.map);
    if (pool_) k::max_pool2d_forward(ctx, s.conv_y, k::pool2d_geometry{}, s.y, s.argmax);
    return s.y;
  }
  /// Without a fused pool: conv2d_backward adds the addend where it writes dx.
  bool sums_input_gradient() const override { return !pool_; }
  const tensor& run_backward(const k::context& ctx, const tensor& dy, conv2d_state& s) override {
    tensor* dx = needs_input_grad_ ? &s.dx : nullptr;
    tensor* dbias = o_.bias() ? &b_.grad : nullptr;
    if (s.pooled) {
      k::conv2d_relu_pool_backward(ctx, s.x, w_.value, dy, s.y, s.window, g_, dx, w_.grad, dbias);
    } else if (pool_) {
      k::max_pool2d_backward(ctx, dy, s.argmax, s.conv_y.shape(), s.spread);
      k::conv2d_backward(ctx, s.x, w_.value, s.cols, s.spread, g_, dx, w_.grad, dbias, &s.conv_y);
    } else {
      k::conv2d_backward(ctx, s.x, w_.value, s.cols, dy, g_, dx, w_.grad, dbias, relu_ ? &s.y : nullptr,
                         s.dx_addend, s.map);
    }
    if (!needs_input_grad_) s.dx = tensor();
    return s.dx;
  }
  std::vector<parameter*> parameters() override {
    std::vector<parameter*> v{&w_};
    if (o_.bias()) v.push_back(&b_);
    return v;
  }

private:
  nn::conv2d o_;
  k::conv2d_geometry g_;
  parameter w_{"weight", {}, {}}, b_{"bias", {}, {}};
  bool relu_ = false;  // applies the next layer, a ReLU
  bool pool_ = false;  // and the one after it, a 2x2 max pool of stride 2
};

/// The shape of a call's input (what a pooling's backward scatters into).
struct input_shape_state : layer_state {
  shape x_shape;
};

struct pool_state : input_shape_state {
  std::vector<int32_t> argmax;
};

template <bool Max>
class pool_layer final : public layer_with_state<pool_state> {
public:
  pool_layer(int64_t kernel, int64_t stride) {
    g_.kernel = kernel;
    g_.stride = stride;
    if (kernel <= 0 || stride <= 0) throw error(describe() + ": window and stride must be positive");
  }
  std::string kind() const override { return Max ? "max_pool2d" : "avg_pool2d"; }
  std::string describe() const override {
    return kind() + "(" + n2s(g_.kernel) + (g_.stride != g_.kernel ? ", stride " + n2s(g_.stride) : "") + ")";
  }
  /// A 2x2 window of stride 2 (what a convolution before it can apply).
  bool two_by_two() const { return g_.kernel == 2 && g_.stride == 2; }
  void set_applied_by_previous(bool applied) override { passthrough_ = Max && applied; }
  shape infer(const shape& in, const std::string& source) override {
    if (in.rank() != 3)
      throw shape_error("expects [channels, height, width] inputs, " + source + " gives " + in.to_string());
    if (in[1] < g_.kernel || in[2] < g_.kernel)
      throw shape_error("window " + n2s(g_.kernel) + " does not fit, " + source + " gives " + in.to_string());
    return per_sample(k::pool2d_output_shape(batched(1, in), g_));
  }
  const tensor& run_forward(const k::context& ctx, const tensor& x, bool, pool_state& s) override {
    if (passthrough_) return x;
    s.x_shape = x.shape();
    if (Max)
      k::max_pool2d_forward(ctx, x, g_, s.y, s.argmax);
    else
      k::avg_pool2d_forward(ctx, x, g_, s.y);
    return s.y;
  }
  const tensor& run_backward(const k::context& ctx, const tensor& dy, pool_state& s) override {
    if (passthrough_) return dy;
    if (Max)
      k::max_pool2d_backward(ctx, dy, s.argmax, s.x_shape, s.dx);
    else
      k::avg_pool2d_backward(ctx, dy, g_, s.x_shape, s.dx);
    return s.dx;
  }

private:
  k::pool2d_geometry g_;
  bool passthrough_ = false;  // the convolution before the ReLU before it applies this pool
};

bool conv2d_layer::fuse_also(const layer* after) {
  if (pool_) return false;  // applies nothing after its pool
  const auto* pool = dynamic_cast<const pool_layer<true>*>(after);
  pool_ = relu_ && pool && pool->two_by_two();
  return pool_;
}

class global_avg_pool_layer final : public layer_with_state<input_shape_state> {
public:
  std::string kind() const override { return "global_avg_pool"; }
  std::string describe() const override { return "global_avg_pool"; }
  shape infer(const shape& in, const std::string& source) override {
    if (in.rank() != 3)
      throw shape_error("expects [channels, height, width] inputs, " + source + " gives " + in.to_string());
    return {in[0]};
  }
  const tensor& run_forward(const k::context& ctx, const tensor& x, bool, input_shape_state& s) override {
    s.x_shape = x.shape();
    k::global_avg_pool2d_forward(ctx, x, s.y);
    return s.y;
  }
  const tensor& run_backward(const k::context& ctx, const tensor& dy, input_shape_state& s) override {
    k::global_avg_pool2d_backward(ctx, dy, s.x_shape, s.dx);
    return s.dx;
  }
};

enum class act { relu, tanh, sigmoid };

template <act A>
class activation_layer final : public layer {
public:
  std::string kind() const override { return A == act::relu ? "relu" : A == act::tanh ? "tanh" : "sigmoid"; }
  std::string describe() const override { return kind(); }
  shape infer(const shape& in, const std::string&) override { return in; }
  void set_applied_by_previous(bool applied) override { passthrough_ = A == act::relu && applied; }
  bool decodes() const override { return true; }  // elementwise
  const tensor& forward(const k::context& ctx, const tensor& x, bool, layer_state& s) override {
    if (passthrough_) return x;
    if (A == act::relu) k::relu_forward(ctx, x, s.y);
    if (A == act::tanh) k::tanh_forward(ctx, x, s.y);
    if (A == act::sigmoid) k::sigmoid_forward(ctx, x, s.y);
    return s.y;
  }
  const tensor& backward(const k::context& ctx, const tensor& dy, layer_state& s) override {
    if (passthrough_) return dy;
    if (A == act::relu) k::relu_backward(ctx, s.y, dy, s.dx);
    if (A == act::tanh) k::tanh_backward(ctx, s.y, dy, s.dx);
    if (A == act::sigmoid) k::sigmoid_backward(ctx, s.y, dy, s.dx);
    return s.dx;
  }

private:
  bool passthrough_ = false;  // the previous layer applies this ReLU
};

class flatten_layer final : public layer_with_state<input_shape_state> {
public:
  std::string kind() const override { return "flatten"; }
  std::string describe() const override { return "flatten"; }
  shape infer(const shape& in, const std::string&) override { return {in.numel()}; }
  // Views of the input and of the gradient (never written: a caller's memory in y or dx is let go).
  const tensor& run_forward(const k::context&, const tensor& x, bool, input_shape_state& s) override {
    s.x_shape = x.shape();
    s.y = x.reshape({x.dim(0), -1});
    return s.y;
  }
  const tensor& run_backward(const k::context&, const tensor& dy, input_shape_state& s) override {
    s.dx = dy.reshape(s.x_shape);
    return s.dx;
  }
};

struct dropout_state : layer_state {
  bool dropped = false;  // training with p > 0: the mask applies
  tensor mask;
};

class dropout_layer final : public layer_with_state<dropout_state> {
public:
  explicit dropout_layer(float p) : p_(p) {
    if (!(p >= 0.0f && p < 1.0f)) throw error("dropout(" + std::to_string(p) + "): p must be in [0, 1)");
  }
  std::string kind() const override { return "dropout"; }
  std::string describe() const override {
    std::ostringstream os;
    os << "dropout(" << p_ << ")";
    return os.str();
  }
  shape infer(const shape& in, const std::string&) override { return in; }
  void initialize(std::mt19937_64& rng) override { seed_ = rng(); counter_ = 0; }
  bool decodes() const override { return true; }  // the identity outside training
  const tensor& run_forward(const k::context& ctx, const tensor& x, bool training, dropout_state& s) override {
    s.dropped = training && p_ > 0.0f;
    if (!s.dropped) return x;
    k::dropout_forward(ctx, x, p_, seed_, counter_++, s.mask, s.y);
    return s.y;
  }
  const tensor& run_backward(const k::context& ctx, const tensor& dy, dropout_state& s) override {
    if (!s.dropped) return dy;
    k::dropout_backward(ctx, dy, s.mask, s.dx);
    return s.dx;
  }

private:
  float p_;
  uint64_t seed_ = 0, counter_ = 0;  // the masks' stream: one draw per training call, in call order
};

struct batch_norm_state : layer_state {
  tensor x, mean, invstd;  // its input, and the batch's statistics
  // With its own ReLU, output_map holds each channel's scale and shift: the ReLU's mask in backward, and
  // what its input stands for when the output is deferred.
};

class batch_norm_layer final : public layer_with_state<batch_norm_state> {
public:
  explicit batch_norm_layer(const nn::batch_norm& o) : o_(o) {
    if (o.features <= 0) throw error("batch_norm(" + n2s(o.features) + "): features must be positive");
    if (!(o.eps() > 0.0f) || !(o.momentum() >= 0.0f && o.momentum() <= 1.0f))
      throw error("batch_norm: eps must be > 0 and momentum in [0, 1]");
  }
  std::string kind() const override { return "batch_norm"; }
  std::string describe() const override { return "batch_norm(" + n2s(o_.features) + ")"; }
  shape infer(const shape& in, const std::string& source) override {
    if ((in.rank() != 1 && in.rank() != 3) || in[0] != o_.features)
      throw shape_error("expects " + n2s(o_.features) + " features or channels ([" + n2s(o_.features) +
                        "] or [" + n2s(o_.features) + ", h, w]), " + source + " gives " + in.to_string());
    return in;
  }
  void initialize(std::mt19937_64&) override {
    gamma_.value = tensor::full({o_.features}, 1.0f);
    beta_.value = tensor::zeros({o_.features});
    running_mean_ = tensor::zeros({o_.features});
    running_var_ = tensor::full({o_.features}, 1.0f);
  }
  bool fuse_next(const layer* next) override {
    relu_ = next && next->kind() == "relu";
    sum_ = sum_relu_ = defer_ = false;
    return relu_;
  }
  bool defer_output() override {
    defer_ = relu_ && !sum_;
    return defer_;
  }
  bool fuse_residual_sum(bool relu) override {
    if (relu_) return false;  // its own ReLU comes before any sum
    sum_ = true;
    sum_relu_ = relu;
    return true;
  }
  const tensor& run_forward(const k::context& ctx, const tensor& x, bool training, batch_norm_state& s) override {
    s.x = x;
    const tensor* addend = sum_ ? s.addend : nullptr;
    if (sum_ && !addend) throw error("batch_norm: makes its residual block's sum, but the block gave no shortcut");
    const bool relu = relu_ || sum_relu_;
    if (training)
      k::batch_norm_forward_train(ctx, x, gamma_.value, beta_.value, o_.eps(), o_.momentum(),
                                  running_mean_, running_var_, s.y, s.mean, s.invstd, relu, addend,
                                  relu_ ? &s.output_map : nullptr, !defer_);
    else if (defer_)
      k::batch_norm_eval_affine(gamma_.value, beta_.value, o_.eps(), running_mean_, running_var_, s.output_map);
    else
      k::batch_norm_forward_eval(ctx, x, gamma_.value, beta_.value, o_.eps(), running_mean_,
                                 running_var_, s.y, relu, addend);
    return defer_ ? s.x : s.y;  // deferred: the next layer reads x through output_map
  }
  const tensor& run_backward(const k::context& ctx, const tensor& dy, batch_norm_state& s) override {
    // Its own ReLU's mask from x and the forward's scale and shift: one read of y fewer.
    k::batch_norm_backward(ctx, s.x, gamma_.value, s.mean, s.invstd, dy, s.dx, gamma_.grad, beta_.grad, nullptr,
                           relu_ ? &s.output_map : nullptr);
    return s.dx;
  }
  std::vector<parameter*> parameters() override { return {&gamma_, &beta_}; }
  std::vector<named_tensor> buffers() override {
    return {{"running_mean", running_mean_}, {"running_var", running_var_}};
  }

private:
  nn::batch_norm o_;
  bool relu_ = false;  // applies the next layer, a ReLU
  bool sum_ = false, sum_relu_ = false;  // makes its residual block's sum (and the ReLU after it)
  bool defer_ = false;  // writes no output: the layer after its ReLU reads x through output_map
  parameter gamma_{"gamma", {}, {}}, beta_{"beta", {}, {}};
  tensor running_mean_, running_var_;
};

} // namespace

} // namespace troupe::model

namespace troupe::nn {

using model::layer;

std::unique_ptr<layer> dense::make() const { return std::make_unique<model::dense_layer>(*this); }
std::unique_ptr<layer> conv2d::make() const { return std::make_unique<model::conv2d_layer>(*this); }
std::unique_ptr<layer> max_pool2d::make() const {
  return std::make_unique<model::pool_layer<true>>(kernel_size, stride_);
}
std::unique_ptr<layer> avg_pool2d::make() const {
  return std::make_unique<model::pool_layer<false>>(kernel_size, stride_);
}
std::unique_ptr<layer> global_avg_pool::make() const { return std::make_unique<model::global_avg_pool_layer>(); }
std::unique_ptr<layer> relu::make() const { return std::make_unique<model::activation_layer<model::act::relu>>(); }
std::unique_ptr<layer> tanh::make() const { return std::make_unique<model::activation_layer<model::act::tanh>>(); }
std::unique_ptr<layer> sigmoid::make() const {
  return std::make_unique<model::activation_layer<model::act::sigmoid>>();
}
std::unique_ptr<layer> flatten::make() const { return std::make_unique<model::flatten_layer>(); }
std::unique_ptr<layer> dropout::make() const { return std::make_unique<model::dropout_layer>(p); }
std::unique_ptr<layer> batch_norm::make() const { return std::make_unique<model::batch_norm_layer>(*this); }

} // namespace troupe::nn
