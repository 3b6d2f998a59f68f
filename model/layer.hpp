#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/context.hpp"
#include "tensor/tensor.hpp"

namespace troupe::model {

/// A trainable tensor and its gradient (written by the last backward pass).
struct parameter {
  std::string name;  ///< e.g. "0.conv2d.weight"
  tensor value;
  tensor grad;
};

/// Weight initialisation schemes.
enum class init_scheme {
  he,      ///< normal, std = sqrt(2 / fan_in) (He et al. 2015): for ReLU nets
  xavier,  ///< uniform, limit = sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio 2010)
  gpt2,    ///< normal, std = 0.02 (GPT-2's linears; nanoGPT's)
};

/// What one call of a layer keeps between its forward and its backward pass
/// (its input, its statistics, ...) and the buffers it writes: the call's,
/// not the layer's. The caller owns it (model::activations: one per
/// micro-batch in flight) and the layer makes it (layer::make_state), a type
/// of its own that adds what it keeps to these two.
struct layer_state {
  virtual ~layer_state() = default;
  /// The output the layer writes, and the input gradient. A caller may point
  /// either at memory of its own with the result's shape (tensor::wrap), and
  /// the layer writes there (kernels keep a buffer of the right shape).
  tensor y, dx;
  /// What the layer adds to its output in its forward pass, for a residual
  /// block whose sum it makes (layer::fuse_residual_sum): set by the block
  /// before each call; null otherwise.
  const tensor* addend = nullptr;
  /// What the layer adds to its input gradient in its backward pass, for a
  /// residual block whose sum of gradients it makes
  /// (layer::sums_input_gradient): set by the block before each call; null
  /// otherwise.
  const tensor* dx_addend = nullptr;
  /// With a deferred output (layer::defer_output): the map the layer's
  /// returned input stands for, [2, c] (each channel's scale, then its shift,
  /// then max(., 0)), written by each forward call.
  tensor output_map;
  /// The map this layer's input stands for (the deferring layer's
  /// output_map), for a layer that reads its input through one
  /// (layer::takes_input_map): set by the block before each call; null
  /// otherwise.
  const tensor* input_map = nullptr;
};

/// One layer of a model. Forward and backward take the call's state and
/// return references to buffers in it (or to their input, for a layer that
/// passes it through); they stay valid until that state's next call.
class layer {
public:
  virtual ~layer() = default;

  /// "dense", "conv2d", ...
  virtual std::string kind() const = 0;
  /// Kind with its configuration, e.g. "dense(3136 -> 128)".
  virtual std::string describe() const = 0;
  /// Output shape of one sample (no batch dimension) given the input's.
  /// `source` names where the input comes from ("previous layer (relu #3)");
  /// a mismatch throws troupe::shape_error phrased "expects ..., <source> gives ...".
  virtual shape infer(const shape& in, const std::string& source) = 0;
  /// Allocates parameters (after infer) and draws their initial values.
  virtual void initialize(std::mt19937_64& rng) {}
  /// A new state for one call at a time (what forward keeps for backward).
  virtual std::unique_ptr<layer_state> make_state() const { return std::make_unique<layer_state>(); }
  /// The layer's output for the batch x, computed by kernels in `ctx`; what
  /// its backward needs is kept in `s`, which must come from make_state().
  virtual const tensor& forward(const kernels::context& ctx, const tensor& x, bool training, layer_state& s) = 0;
  /// Gradient of the loss w.r.t. the input of the forward pass that filled
  /// `s`; undefined when the layer was told its input needs none. Parameter
  /// gradients are written, not accumulated.
  virtual const tensor& backward(const kernels::context& ctx, const tensor& dy, layer_state& s) = 0;
  /// The same with a state the layer keeps for itself (one call at a time).
  const tensor& forward(const kernels::context& ctx, const tensor& x, bool training) {
    return forward(ctx, x, training, own_state());
  }
  const tensor& backward(const kernels::context& ctx, const tensor& dy) { return backward(ctx, dy, own_state()); }
  /// A block whose backward is a chain of parts run last first (a transformer
  /// block: its attention, then its MLP): how many; 1 for any other layer.
  /// backward() is backward_part() from the last part down to the first, on
  /// each part's output gradient, stopping at a part that returns none.
  virtual std::size_t backward_parts() const { return 1; }
  /// Part `part`'s backward on the gradient of its output (the layer's dy for
  /// the last part); its input's gradient, undefined when it needs none. A
  /// plain layer's one part is backward(): a worker lets messages in between parts.
  virtual const tensor& backward_part(const kernels::context& ctx, const tensor& dy, layer_state& s,
                                      std::size_t part) {
    (void)part;
    return backward(ctx, dy, s);
  }
  /// Incremental decoding of one sequence (generation that keeps each
  /// attention's keys and values): the layer's output for positions
  /// [start, start + n) of a sequence whose rows x [1, n, ...] holds, when
  /// positions [0, start) went through the same state `s` in earlier calls
  /// (start 0 begins a sequence; a smaller start than before goes back).
  /// Only for a layer whose decodes() is true: its rows are then those
  /// forward() gives for the sequence's first start + n positions. A layer
  /// that treats each position alone decodes by its forward pass.
  virtual const tensor& decode(const kernels::context& ctx, const tensor& x, int64_t start, layer_state& s) {
    (void)start;
    return forward(ctx, x, false, s);
  }
  /// True when decode() is right for this layer: it treats each position
  /// alone (a token embedding, a layer norm, a dense layer over the last
  /// dimension, an activation), or decodes its own way (the attention, the
  /// position embedding), or is a block of such layers.
  virtual bool decodes() const { return false; }
  virtual std::vector<parameter*> parameters() { return {}; }
  /// The size of the table its input indexes (an embedding's vocabulary: its
  /// input holds token ids in [0, size)); 0 for an input of real values.
  virtual int64_t input_ids() const { return 0; }
  /// Non-trainable state saved in checkpoints (batch norm's running statistics).
  virtual std::vector<named_tensor> buffers() { return {}; }

  /// The layers inside a block, in the order they run, each with its place
  /// in the block ("1", "projection 1"); empty for a plain layer.
  struct inner_layer {
    std::string place;
    layer* inner;
  };
  virtual std::vector<inner_layer> inner_layers() { return {}; }

  /// Kernel fusion, decided again at every model::build (and by a block for
  /// the layers inside it): `next` is the layer after this one in its chain,
  /// or null. Returns true when this layer applies `next`'s function in its
  /// own output pass (a convolution or batch norm the ReLU after it); `next`
  /// is then told so by set_applied_by_previous(true), and passes its input
  /// and its gradient through. Results stay the same.
  virtual bool fuse_next(const layer* next) { return false; }
  /// Asked after fuse_next returned true, about the layer after the last one
  /// this layer applies (and again while it returns true): true when it
  /// applies that one too (a convolution with its ReLU, the 2x2 max pool
  /// after them), which is then told so as `next` was.
  virtual bool fuse_also(const layer* after) { return false; }
  virtual void set_applied_by_previous(bool applied) {}
  /// Asked by a residual block of its body's last layer, after fuse_next (which
  /// undoes it): true when this layer adds the block's shortcut (the state's
  /// `addend`) to its output in its own output pass, then applies max(., 0)
  /// when `relu`; the block's output is then this layer's, and the block makes
  /// no sum of its own. Its backward pass stays that of the layer alone.
  virtual bool fuse_residual_sum(bool relu) { return false; }
  /// Asked by a residual block of its body's first layer: true when this
  /// layer's backward pass adds the state's `dx_addend` (the shortcut's
  /// gradient) to its input gradient in the pass that writes it; the block
  /// then makes no sum of gradients of its own. The same bits as add() after.
  virtual bool sums_input_gradient() const { return false; }
  /// Asked by a residual block of a body layer that applies the ReLU after it
  /// (fuse_next), when the layer after that ReLU takes an input map: true
  /// when this layer then writes no output, returns its input, and leaves in
  /// its state's output_map what that input stands for (a batch norm's
  /// scale and shift, then the ReLU), which the block hands to the next
  /// layer as its input_map. Undone by fuse_next.
  virtual bool defer_output() { return false; }
  /// True when the layer reads its input through the state's input_map where
  /// one is set (a convolution: where its kernels load x).
  virtual bool takes_input_map() const { return false; }

  /// Layers before the first one with parameters need no input gradient
  /// (model::build sets this); skipping it saves work. A block passes it on
  /// to the layers inside it.
  virtual void set_needs_input_grad(bool b) { needs_input_grad_ = b; }
  bool needs_input_grad() const { return needs_input_grad_; }

protected:
  bool needs_input_grad_ = true;

private:
  layer_state& own_state() {
    if (!own_) own_ = make_state();
    return *own_;
  }
  std::unique_ptr<layer_state> own_;
};

/// A layer whose calls keep a `State` (derived from layer_state): it
/// implements run_forward/run_backward on its own state type.
template <class State>
class layer_with_state : public layer {
public:
  using layer::backward;
  using layer::forward;
  std::unique_ptr<layer_state> make_state() const override { return std::make_unique<State>(); }
  const tensor& forward(const kernels::context& ctx, const tensor& x, bool training, layer_state& s) final {
    return run_forward(ctx, x, training, static_cast<State&>(s));
  }
  const tensor& backward(const kernels::context& ctx, const tensor& dy, layer_state& s) final {
    return run_backward(ctx, dy, static_cast<State&>(s));
  }

protected:
  virtual const tensor& run_forward(const kernels::context& ctx, const tensor& x, bool training, State& s) = 0;
  virtual const tensor& run_backward(const kernels::context& ctx, const tensor& dy, State& s) = 0;
};

} // namespace troupe::model
