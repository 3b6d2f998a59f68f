#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/layer.hpp"
#include "model/layout.hpp"
#include "tensor/tensor.hpp"

namespace troupe::model {

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
  /// Backward pass from d(loss)/d(output) in `ctx`; fills every parameter's grad.
  void backward(const kernels::context& ctx, const tensor& dout);

  std::vector<parameter*> parameters();
  /// The declared layout of parameters(): names, shapes and offsets in one
  /// flat buffer, in model order.
  param_layout layout();
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
  void require_built(const char* what) const;

  std::vector<std::unique_ptr<layer>> layers_;
  std::vector<shape> shapes_;  // output shape of each layer (per sample)
  shape input_;
  bool built_ = false;
};

} // namespace troupe::model
