#pragma once

// A chain of layers run in order, with one state per layer for each call:
// the model's own chain, and the chains inside its blocks (residual,
// transformer_block) run the same way.

#include <memory>
#include <vector>

#include "model/layer.hpp"

namespace troupe::model {

using layer_list = std::vector<std::unique_ptr<layer>>;
using state_list = std::vector<std::unique_ptr<layer_state>>;

/// Kernel fusion between neighbours of the chain (layer::fuse_next, then
/// layer::fuse_also): a layer is asked about the next, and about the one
/// after while it applies the one before; each is told whether it is applied
/// by a layer before it; the first is applied by none.
void fuse_chain(layer_list& chain);

/// A layer needs its input gradient when the chain's input needs one
/// (`input_needs_grad`) or a layer before it in the chain learns.
void set_needs_input_grad_chain(layer_list& chain, bool input_needs_grad);

/// One new state per layer of `chain`, for one call at a time.
state_list make_states(const layer_list& chain);

/// The chain's output for x (its input when the chain is empty).
const tensor& forward_chain(const kernels::context& ctx, layer_list& chain, state_list& states, const tensor& x,
                            bool training);

/// The chain's output for positions [start, start + n) of one sequence
/// (layer::decode, layer by layer); its input when the chain is empty.
const tensor& decode_chain(const kernels::context& ctx, layer_list& chain, state_list& states, const tensor& x,
                           int64_t start);
/// True when every layer of the chain decodes (layer::decodes).
bool chain_decodes(const layer_list& chain);

/// The backward passes from the chain's end; the gradient of the chain's
/// input, undefined when a layer needs none (nothing before it learns).
const tensor& backward_chain(const kernels::context& ctx, layer_list& chain, state_list& states, const tensor& dy);

} // namespace troupe::model
