// The residual block behind nn::residual: output = body(x) + shortcut(x).
#include "kernels/kernels.hpp"
#include "model/chain.hpp"
#include "model/nn.hpp"

namespace troupe::model {

namespace {

namespace k = troupe::kernels;

using layers = layer_list;

layers make_all(const std::vector<nn::residual::layer_factory>& factories) {
  layers out;
  for (const auto& f : factories) out.push_back(f());
  return out;
}

std::string join_described(const layers& ls) {
  std::string out;
  for (const auto& l : ls) out += (out.empty() ? "" : ", ") + l->describe();
  return out;
}

struct residual_state : layer_state {
  state_list body, projection;  // the calls of the layers inside
  tensor dy;                    // the gradient through the fused ReLU
};

class residual_layer final : public layer_with_state<residual_state> {
public:
  residual_layer(layers body, layers projection) : body_(std::move(body)), projection_(std::move(projection)) {
    if (body_.empty()) throw error("residual(): the body needs at least one layer");
  }

  std::string kind() const override { return "residual"; }
  std::string describe() const override {
    std::string out = "residual(" + join_described(body_);
    if (!projection_.empty()) out += "; projection " + join_described(projection_);
    return out + ")";
  }

  shape infer(const shape& in, const std::string& source) override {
    const shape body_out = infer_chain(body_, in, source, false);
    const shape shortcut_out = projection_.empty() ? in : infer_chain(projection_, in, source, true);
    if (body_out != shortcut_out) {
      const std::string what = projection_.empty() ? " gives the identity shortcut's " + in.to_string() +
                                                         ": give the block a projection(...) that makes " +
                                                         body_out.to_string() + " of it"
                                                   : " gives " + shortcut_out.to_string() + " (its projection)";
      throw shape_error("the body gives " + body_out.to_string() + " but the shortcut" + what);
    }
    return body_out;
  }

  void initialize(std::mt19937_64& rng) override {
    for (auto& l : body_) l->initialize(rng);
    for (auto& l : projection_) l->initialize(rng);
  }

  bool fuse_next(const layer* next) override {
    fuse_chain(body_);
    fuse_chain(projection_);
    relu_ = next && next->kind() == "relu";
    body_sum_ = body_.back()->fuse_residual_sum(relu_);
    gradient_sum_ = body_.front()->sums_input_gradient();
    // A layer whose output, through the ReLU it applies, only the layer after that ReLU reads: that
    // layer reads it through the map (a batch norm's output never written).
    deferred_.clear();
    for (std::size_t i = 0; i + 2 < body_.size(); ++i)
      if (body_[i + 1]->kind() == "relu" && body_[i + 2]->takes_input_map() && body_[i]->defer_output())
        deferred_.push_back(i);
    return relu_;
  }

  std::unique_ptr<layer_state> make_state() const override {
    auto s = std::make_unique<residual_state>();
    s->body = make_states(body_);
    s->projection = make_states(projection_);
    return s;
  }

  const tensor& run_forward(const k::context& ctx, const tensor& x, bool training, residual_state& s) override {
    return sum(ctx, s, [&](layers& chain, state_list& states) -> const tensor& {
      return forward_chain(ctx, chain, states, x, training);
    });
  }

  const tensor& decode(const k::context& ctx, const tensor& x, int64_t start, layer_state& s) override {
    return sum(ctx, static_cast<residual_state&>(s), [&](layers& chain, state_list& states) -> const tensor& {
      return decode_chain(ctx, chain, states, x, start);
    });
  }
  bool decodes() const override { return chain_decodes(body_) && chain_decodes(projection_); }

  const tensor& run_backward(const k::context& ctx, const tensor& dy_out, residual_state& s) override {
    const tensor* dy = &dy_out;
    if (relu_) {
      k::relu_backward(ctx, body_sum_ ? s.body.back()->y : s.y, dy_out, s.dy);
      dy = &s.dy;
    }
    // d(body + shortcut)/dx: the gradient through the body plus the one through the shortcut.
    if (gradient_sum_ && needs_input_grad_) {  // the body's first layer adds the shortcut's: the same bits
      const tensor& shortcut_dx = backward_chain(ctx, projection_, s.projection, *dy);
      s.body.front()->dx_addend = &shortcut_dx;
      return backward_chain(ctx, body_, s.body, *dy);
    }
    s.body.front()->dx_addend = nullptr;
    const tensor& body_dx = backward_chain(ctx, body_, s.body, *dy);
    const tensor& shortcut_dx = backward_chain(ctx, projection_, s.projection, *dy);
    if (!needs_input_grad_) {
      s.dx = tensor();
      return s.dx;
    }
    k::add(ctx, body_dx, shortcut_dx, s.dx);
    return s.dx;
  }

  std::vector<parameter*> parameters() override {
    std::vector<parameter*> out;
    collect(body_, "", out);
    collect(projection_, "projection.", out);
    named_ = true;
    return out;
  }

  std::vector<named_tensor> buffers() override {
    std::vector<named_tensor> out;
    for (std::size_t i = 0; i < body_.size(); ++i)
      for (auto& b : body_[i]->buffers()) out.push_back({prefix("", i, *body_[i]) + b.name, b.value});
    for (std::size_t i = 0; i < projection_.size(); ++i)
      for (auto& b : projection_[i]->buffers())
        out.push_back({prefix("projection.", i, *projection_[i]) + b.name, b.value});
    return out;
  }

  std::vector<inner_layer> inner_layers() override {
    std::vector<inner_layer> out;
    for (std::size_t i = 0; i < body_.size(); ++i) out.push_back({std::to_string(i + 1), body_[i].get()});
    for (std::size_t i = 0; i < projection_.size(); ++i)
      out.push_back({"projection " + std::to_string(i + 1), projection_[i].get()});
    return out;
  }

  void set_needs_input_grad(bool b) override {
    layer::set_needs_input_grad(b);
    // As model::build: a layer needs its input gradient when the block's
    // input needs one or a layer before it (inside the block) learns.
    set_needs_input_grad_chain(body_, b);
    set_needs_input_grad_chain(projection_, b);
  }

private:
  /// body(x) + shortcut(x), each chain run by `run` (a forward pass or decoding): the output.
  template <class Run>
  const tensor& sum(const k::context& ctx, residual_state& s, Run run) {
    for (std::size_t i : deferred_) s.body[i + 2]->input_map = &s.body[i]->output_map;
    if (body_sum_) {  // the body's last layer adds the shortcut (and applies the ReLU): the same bits
      s.body.back()->addend = &run(projection_, s.projection);
      return run(body_, s.body);
    }
    const tensor& out = run(body_, s.body);
    const tensor& shortcut = run(projection_, s.projection);
    k::add(ctx, out, shortcut, s.y, relu_);
    return s.y;
  }

  /// "conv2d #2 inside", "conv2d #1 of the projection".
  static std::string inner_name(const layer& l, std::size_t i, bool projection) {
    return l.kind() + " #" + std::to_string(i + 1) + (projection ? " of the projection" : " inside");
  }

  static shape infer_chain(layers& chain, const shape& in, const std::string& source, bool projection) {
    shape cur = in;
    for (std::size_t i = 0; i < chain.size(); ++i) {
      const std::string from = i == 0 ? source : "previous layer (" + inner_name(*chain[i - 1], i - 1, projection) + ")";
      try {
        cur = chain[i]->infer(cur, from);
      } catch (const shape_error& e) {
        const bool block = !chain[i]->inner_layers().empty();
        throw shape_error(inner_name(*chain[i], i, projection) + (block ? ": " : " ") + e.what());
      }
    }
    return cur;
  }

  static std::string prefix(const char* chain, std::size_t i, const layer& l) {
    return chain + std::to_string(i) + "." + l.kind() + ".";
  }

  /// The chain's parameters, named after their place in the block the first
  /// time (the model adds the block's own place in front).
  void collect(layers& chain, const char* name, std::vector<parameter*>& out) {
    for (std::size_t i = 0; i < chain.size(); ++i)
      for (parameter* p : chain[i]->parameters()) {
        if (!named_) p->name = prefix(name, i, *chain[i]) + p->name;
        out.push_back(p);
      }
  }

  layers body_, projection_;
  bool named_ = false;
  bool relu_ = false;      // applies the next layer, a ReLU, to the sum
  bool body_sum_ = false;  // the body's last layer makes the sum (fuse_residual_sum)
  bool gradient_sum_ = false;  // the body's first layer makes the sum of gradients (sums_input_gradient)
  std::vector<std::size_t> deferred_;  // body layers whose output the layer two on reads through its map
};

} // namespace

} // namespace troupe::model

namespace troupe::nn {

std::unique_ptr<model::layer> residual::make() const {
  return std::make_unique<model::residual_layer>(model::make_all(body), model::make_all(shortcut));
}

} // namespace troupe::nn
