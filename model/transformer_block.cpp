// The block behind nn::transformer_block: a chain of two residual blocks
// (attention, then the MLP), one layer of the model's chain.
#include "model/chain.hpp"
#include "model/nn.hpp"

namespace troupe::model {

namespace {

namespace k = troupe::kernels;

using layers = layer_list;

struct chain_state : layer_state {
  state_list chain;  // the calls of the layers inside
};

class transformer_block_layer final : public layer_with_state<chain_state> {
public:
  transformer_block_layer(const nn::transformer_block& o, layers chain) : o_(o), chain_(std::move(chain)) {}

  std::string kind() const override { return "transformer_block"; }
  std::string describe() const override {
    return "transformer_block(" + std::to_string(o_.dim) + ", " + std::to_string(o_.heads) + " heads, mlp x" +
           std::to_string(o_.mlp_ratio) + ")";
  }

  shape infer(const shape& in, const std::string& source) override {
    shape cur = in;
    for (std::size_t i = 0; i < chain_.size(); ++i) {
      const std::string from = i == 0 ? source : "previous layer (" + inner_name(i - 1) + ")";
      try {
        cur = chain_[i]->infer(cur, from);
      } catch (const shape_error& e) {
        throw shape_error(inner_name(i) + ": " + e.what());
      }
    }
    return cur;
  }

  void initialize(std::mt19937_64& rng) override {
    for (auto& l : chain_) l->initialize(rng);
  }

  bool fuse_next(const layer*) override {
    fuse_chain(chain_);
    return false;
  }

  std::unique_ptr<layer_state> make_state() const override {
    auto s = std::make_unique<chain_state>();
    s->chain = make_states(chain_);
    return s;
  }

  const tensor& run_forward(const k::context& ctx, const tensor& x, bool training, chain_state& s) override {
    return forward_chain(ctx, chain_, s.chain, x, training);
  }

  const tensor& run_backward(const k::context& ctx, const tensor& dy, chain_state& s) override {
    return backward_chain(ctx, chain_, s.chain, dy);
  }

  const tensor& decode(const k::context& ctx, const tensor& x, int64_t start, layer_state& s) override {
    return decode_chain(ctx, chain_, static_cast<chain_state&>(s).chain, x, start);
  }
  bool decodes() const override { return chain_decodes(chain_); }

  std::size_t backward_parts() const override { return chain_.size(); }
  const tensor& backward_part(const k::context& ctx, const tensor& dy, layer_state& s, std::size_t part) override {
    return chain_.at(part)->backward(ctx, dy, *static_cast<chain_state&>(s).chain.at(part));
  }

  std::vector<parameter*> parameters() override {
    std::vector<parameter*> out;
    for (std::size_t i = 0; i < chain_.size(); ++i)
      for (parameter* p : chain_[i]->parameters()) {
        // Named after the place in the block the first time; the model adds the block's own place.
        if (!named_) p->name = std::to_string(i) + "." + chain_[i]->kind() + "." + p->name;
        out.push_back(p);
      }
    named_ = true;
    return out;
  }

  std::vector<named_tensor> buffers() override {
    std::vector<named_tensor> out;
    for (std::size_t i = 0; i < chain_.size(); ++i)
      for (auto& b : chain_[i]->buffers())
        out.push_back({std::to_string(i) + "." + chain_[i]->kind() + "." + b.name, b.value});
    return out;
  }

  std::vector<inner_layer> inner_layers() override {
    std::vector<inner_layer> out;
    for (std::size_t i = 0; i < chain_.size(); ++i) out.push_back({std::to_string(i + 1), chain_[i].get()});
    return out;
  }

  void set_needs_input_grad(bool b) override {
    layer::set_needs_input_grad(b);
    set_needs_input_grad_chain(chain_, b);
  }

private:
  std::string inner_name(std::size_t i) const { return chain_[i]->kind() + " #" + std::to_string(i + 1) + " inside"; }

  nn::transformer_block o_;
  layers chain_;
  bool named_ = false;
};

} // namespace

} // namespace troupe::model

namespace troupe::nn {

std::unique_ptr<model::layer> transformer_block::make() const {
  if (dim <= 0 || heads <= 0 || mlp_ratio <= 0)
    throw error("transformer_block(" + std::to_string(dim) + ", " + std::to_string(heads) + ", " +
                std::to_string(mlp_ratio) + "): sizes must be positive");
  const int64_t hidden = mlp_ratio * dim;
  std::vector<std::unique_ptr<model::layer>> chain;
  chain.push_back(
      residual(layer_norm(dim), causal_self_attention(dim, heads).init(init_).proj_scale(residual_scale_)).make());
  chain.push_back(residual(layer_norm(dim), sequence_dense(dim, hidden).init(init_), gelu(),
                           sequence_dense(hidden, dim).init(init_).init_scale(residual_scale_))
                      .make());
  return std::make_unique<model::transformer_block_layer>(*this, std::move(chain));
}

} // namespace troupe::nn
