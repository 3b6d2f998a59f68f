#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/layer.hpp"
#include "model/layout.hpp"
#include "tensor/tensor.hpp"

namespace troupe::model {

class model;

/// What one forward call of a model keeps for its backward: every layer's
/// layer_state (its input, statistics, output and gradient buffers). One per
/// micro-batch in flight, made by model::make_activations(); the parameters
/// stay the model's. A model used one call at a time keeps its own.
class activations {
public:
  activations() = default;
  activations(activations&&) noexcept = default;
  activations& operator=(activations&&) noexcept = default;

private:
  friend class model;
  std::vector<std::unique_ptr<layer_state>> states_;
  bool lent_y_ = false, lent_dx_ = false;  // the last layer's output / the first's gradient: a caller's memory
};

/// A chain of layers. Build it with nn::sequential(...), then build() it for an
/// input shape before the first forward pass.
class model {
public:
  model() = default;
  explicit model(std::vector<std::unique_ptr<layer>> layers);
  model(model&&) noexcept = default;
  model& operator=(model&&) noexcept = default;

  /// Infers every layer's output shape for samples of shape `input` (no batch
  /// dimension) and initialises parameters from `seed`. A mismatch throws
  /// troupe::shape_error naming the layer, e.g.
  /// "dense #7 expects 3000 inputs, previous layer (flatten #6) gives 3136".
  model& build(const shape& input, uint64_t seed = 1);
  bool built() const { return built_; }

  /// Forward pass over a batch [n, input...], its kernels run in `ctx`. The
  /// result stays valid until the next forward call.
  const tensor& forward(const kernels::context& ctx, const tensor& x, bool training);
  /// New activations for calls of this built model (its layers' states).
  activations make_activations() const;
  /// The forward pass of one call whose activations are `a` (from
  /// make_activations(), not used by another call until its backward is
  /// done): several micro-batches can be in flight, each with its own. With
  /// `out` (of the output's shape [n, output_shape()...], e.g. a message's
  /// payload through tensor::wrap) the output is written there, in place by
  /// the last layer where it writes one, and `out` is returned; the caller
  /// keeps that memory alive until this call's backward (a layer may read
  /// its output back). The result stays valid until `a`'s next forward.
  const tensor& forward(const kernels::context& ctx, const tensor& x, bool training, activations& a,
                        tensor* out = nullptr);
  /// Incremental decoding of one sequence (generation): the output rows of
  /// positions [start, start + n) for tokens x [1, n], when positions
  /// [0, start) went through `a` in earlier calls (start 0 begins a
  /// sequence); each attention keeps its keys and values in `a`, so a new
  /// token costs one position's work, not the sequence's. The same rows as
  /// forward() of the sequence's first start + n positions, up to rounding.
  /// Needs decodes(); start + n at most the input's length. Valid until `a`'s next call.
  const tensor& decode(const kernels::context& ctx, const tensor& x, int64_t start, activations& a);
  /// True when every layer decodes (layer::decodes): a sequence model of
  /// embeddings, attention, layer norms and layers over the last dimension.
  bool decodes() const;
  /// Layer i's forward pass alone, on layer i - 1's output (the batch for
  /// i = 0): forward() one layer at a time, so that a data-parallel worker can
  /// run each parameter shard's layers as soon as that shard's weights arrive.
  const tensor& forward_layer(const kernels::context& ctx, const tensor& x, std::size_t i, bool training);
  /// Layer i's backward pass alone, in its parts (layer::backward_parts: a
  /// transformer block has two, its attention and its MLP; other layers one),
  /// with the activations of the last forward(): part `part` on d(loss)/d(its
  /// output) (for layer i's last part, of layer i's output; the loss gradient
  /// for the model's last layer). backward() one part at a time, last layer and
  /// last part first, so that a worker can let messages in between them.
  /// Returns the part's input gradient, undefined when it needs none (then
  /// nothing before it learns: stop there).
  const tensor& backward_part(const kernels::context& ctx, const tensor& dout, std::size_t i, std::size_t part);
  std::size_t layer_backward_parts(std::size_t i) const;
  /// Whether layer i computes its input gradient (a layer before it learns).
  bool layer_needs_input_grad(std::size_t i) const;
  /// Backward pass from d(loss)/d(output) in `ctx`; fills every parameter's
  /// grad. Returns d(loss)/d(input), valid until the next backward call, or an
  /// undefined tensor when no layer needs it (nothing before this model learns).
  const tensor& backward(const kernels::context& ctx, const tensor& dout);
  /// The backward pass of the call whose forward filled `a`. With `dx` (of
  /// the input's shape) d(loss)/d(input) is written there, and `dx` returned,
  /// unless no layer needs it.
  const tensor& backward(const kernels::context& ctx, const tensor& dout, activations& a, tensor* dx = nullptr);

  /// Layers [first, last) of this built model as a model of their own (a
  /// pipeline stage): they move out of this model, which is left empty.
  /// Parameter and buffer names keep the layers' indices in the whole model
  /// ("3.dense.weight"), so checkpoints and shards see the same names whole or
  /// in stages. A slice that does not start at the first layer computes its
  /// input gradient (backward returns it), to send to the stage before it.
  /// Throws troupe::error for an empty or out-of-range cut.
  model slice(std::size_t first, std::size_t last);
  /// Per layer: its number of parameter tensors, and a rough cost of its
  /// forward pass per sample in multiply-adds (a layer's weights times the
  /// output positions that reuse them; an elementwise layer's outputs). What
  /// a pipeline is cut by.
  struct layer_profile {
    std::vector<int> tensors;
    std::vector<int64_t> costs;
    std::vector<int64_t> param_bytes;   ///< its parameters' bytes
    std::vector<int64_t> output_elems;  ///< its output's elements per sample
  };
  layer_profile profile() const;
  /// The index in the whole model of this model's first layer (0 unless sliced).
  std::size_t first_layer() const { return first_; }

  std::vector<parameter*> parameters();
  /// The declared layout of parameters(): names, shapes and offsets in one
  /// flat buffer, in model order.
  param_layout layout();
  /// Points every parameter's value at `values` (read-only) and its
  /// gradient at `grads`, each layout().numel() floats in layout() order:
  /// memory the caller owns (a weight version, a shared gradient buffer)
  /// and keeps alive while the model uses it, until the next bind() or
  /// flatten(). Backward passes write the gradients there.
  void bind(const float* values, float* grads);
  /// Moves every parameter's value into one flat buffer and every gradient
  /// into another, in layout() order (values kept; the parameters become views
  /// of the buffers). Returns the two buffers, of layout().numel() elements.
  struct flat_buffers {
    tensor values, grads;
  };
  flat_buffers flatten();
  /// Parameters and buffers by name: what a checkpoint stores.
  std::vector<named_tensor> state();
  /// Copies `entries` into the model's state. Throws when the architecture
  /// string differs or an entry is missing or has another shape.
  void load_state(const std::string& architecture, const std::vector<named_tensor>& entries);

  /// One line per layer: name, output shape, parameter count; and totals.
  std::string summary() const;
  /// A string that identifies the architecture (layers and shapes).
  std::string architecture() const;
  int64_t num_parameters() const;
  const shape& input_shape() const { return input_; }
  const shape& output_shape() const;
  std::size_t size() const { return layers_.size(); }
  layer& at(std::size_t i) { return *layers_.at(i); }

private:
  /// Gives every parameter its name in the whole model ("3.dense.weight"),
  /// once, when the model is built: names never change afterwards.
  void name_parameters();
  void require_built(const char* what) const;
  void check_activations(const activations& a, const char* what) const;
  /// The activations of the calls that name none (made at the first).
  activations& own_activations();
  void check_input(const tensor& x) const;

  std::vector<std::unique_ptr<layer>> layers_;
  std::vector<shape> shapes_;  // output shape of each layer (per sample)
  shape input_;
  std::size_t first_ = 0;  // index of layers_[0] in the whole model
  activations own_;
  bool built_ = false;
};

} // namespace troupe::model
