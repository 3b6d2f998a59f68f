#include "model/model.hpp"

#include "model/chain.hpp"

#include <algorithm>
#include <iomanip>
#include <map>
#include <sstream>

namespace troupe::model {

namespace {
std::string layer_name(const layer& l, std::size_t i) { return l.kind() + " #" + std::to_string(i + 1); }
} // namespace

void fuse_chain(layer_list& chain) {
  if (!chain.empty()) chain.front()->set_applied_by_previous(false);
  for (std::size_t i = 0; i < chain.size();) {
    std::size_t next = i + 1;  // the first layer after i that i does not apply
    bool fused = chain[i]->fuse_next(next < chain.size() ? chain[next].get() : nullptr);
    while (fused) {
      chain[next++]->set_applied_by_previous(true);
      fused = next < chain.size() && chain[i]->fuse_also(chain[next].get());
    }
    if (next < chain.size()) chain[next]->set_applied_by_previous(false);
    i = next;
  }
}

void set_needs_input_grad_chain(layer_list& chain, bool input_needs_grad) {
  bool learns_upstream = input_needs_grad;
  for (auto& l : chain) {
    l->set_needs_input_grad(learns_upstream);
    if (!l->parameters().empty()) learns_upstream = true;
  }
}

state_list make_states(const layer_list& chain) {
  state_list out;
  out.reserve(chain.size());
  for (const auto& l : chain) out.push_back(l->make_state());
  return out;
}

const tensor& forward_chain(const kernels::context& ctx, layer_list& chain, state_list& states, const tensor& x,
                            bool training) {
  const tensor* cur = &x;
  for (std::size_t i = 0; i < chain.size(); ++i) cur = &chain[i]->forward(ctx, *cur, training, *states[i]);
  return *cur;
}

const tensor& decode_chain(const kernels::context& ctx, layer_list& chain, state_list& states, const tensor& x,
                           int64_t start) {
  const tensor* cur = &x;
  for (std::size_t i = 0; i < chain.size(); ++i) cur = &chain[i]->decode(ctx, *cur, start, *states[i]);
  return *cur;
}

bool chain_decodes(const layer_list& chain) {
  return std::all_of(chain.begin(), chain.end(), [](const std::unique_ptr<layer>& l) { return l->decodes(); });
}

const tensor& backward_chain(const kernels::context& ctx, layer_list& chain, state_list& states, const tensor& dy) {
  static const tensor none;
  const tensor* cur = &dy;
  for (std::size_t i = chain.size(); i-- > 0;) {
    cur = &chain[i]->backward(ctx, *cur, *states[i]);
    if (!chain[i]->needs_input_grad()) return none;  // nothing before it learns
  }
  return *cur;
}

model::model(std::vector<std::unique_ptr<layer>> layers) : layers_(std::move(layers)) {
  if (layers_.empty()) throw error("a model needs at least one layer");
}

model& model::build(const shape& input, uint64_t seed) {
  if (layers_.empty()) throw error("a model needs at least one layer");
  for (auto d : input.dims())
    if (d <= 0) throw shape_error("model input shape " + input.to_string() + " has a non-positive dimension");
  shapes_.clear();
  shape cur = input;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    std::string source =
        i == 0 ? "the model input" : "previous layer (" + layer_name(*layers_[i - 1], i - 1) + ")";
    try {
      cur = layers_[i]->infer(cur, source);
    } catch (const shape_error& e) {
      // "dense #8 expects ...", "residual #3: conv2d #2 inside expects ..."
      const bool block = !layers_[i]->inner_layers().empty();
      throw shape_error(layer_name(*layers_[i], i) + (block ? ": " : " ") + e.what());
    }
    shapes_.push_back(cur);
  }
  std::mt19937_64 rng(seed);
  for (auto& l : layers_) l->initialize(rng);
  name_parameters();
  fuse_chain(layers_);
  // A layer needs its input gradient only if a layer before it learns: the
  // MLP's first dense layer (after flatten) skips a 64x256x784 product per step.
  set_needs_input_grad_chain(layers_, false);
  input_ = input;
  built_ = true;
  return *this;
}


void model::require_built(const char* what) const {
  if (!built_) throw error(std::string("model::") + what + ": call build(input_shape) first");
}

void model::check_input(const tensor& x) const {
  bool ok = x.rank() == input_.rank() + 1;
  for (std::size_t i = 0; ok && i < input_.rank(); ++i) ok = x.dim(i + 1) == input_[i];
  if (!ok)
    throw shape_error("model input has shape " + x.shape().to_string() + ", the model was built for [n, " +
                      input_.to_string().substr(1));
}

activations model::make_activations() const {
  require_built("make_activations");
  activations a;
  a.states_ = make_states(layers_);
  return a;
}

activations& model::own_activations() {
  if (own_.states_.size() != layers_.size()) own_ = make_activations();
  return own_;
}

void model::check_activations(const activations& a, const char* what) const {
  if (a.states_.size() != layers_.size())
    throw error(std::string("model::") + what + ": activations of " + std::to_string(a.states_.size()) +
                " layers for a model of " + std::to_string(layers_.size()) + " (make them with make_activations())");
}

namespace {
/// Points `slot` at the caller's `memory` for one call (or lets go of memory
/// lent to an earlier call); `lent` remembers which.
void lend(tensor& slot, const tensor* memory, bool& lent) {
  if (memory) slot = *memory;
  else if (lent) slot = tensor();
  lent = memory != nullptr;
}

/// The result in the caller's memory: copied there unless the layer wrote it there.
const tensor& into(const tensor& result, tensor* memory, const char* what) {
  if (!memory || !result.defined()) return result;
  if (result.shape() != memory->shape())
    throw shape_error(std::string("model::") + what + ": the caller's memory has shape " +
                      memory->shape().to_string() + ", the result " + result.shape().to_string());
  if (result.data() != memory->data()) memory->copy_from(result);
  return *memory;
}
} // namespace

const tensor& model::forward(const kernels::context& ctx, const tensor& x, bool training) {
  return forward(ctx, x, training, own_activations());
}

const tensor& model::forward(const kernels::context& ctx, const tensor& x, bool training, activations& a,
                             tensor* out) {
  require_built("forward");
  check_input(x);
  check_activations(a, "forward");
  lend(a.states_.back()->y, out, a.lent_y_);
  return into(forward_chain(ctx, layers_, a.states_, x, training), out, "forward");
}

bool model::decodes() const { return built_ && chain_decodes(layers_); }

const tensor& model::decode(const kernels::context& ctx, const tensor& x, int64_t start, activations& a) {
  require_built("decode");
  for (std::size_t i = 0; i < layers_.size(); ++i)
    if (!layers_[i]->decodes())
      throw error("decode: " + layer_name(*layers_[i], i) + " (" + layers_[i]->describe() +
                  ") does not decode a sequence position by position: use forward()");
  check_activations(a, "decode");
  if (input_.rank() != 1 || x.rank() != 2 || x.dim(0) != 1 || x.dim(1) < 1 || start < 0 ||
      x.dim(1) > input_[0] - start)
    throw shape_error("decode: expects one sequence's tokens [1, n] at positions [" + std::to_string(start) +
                      ", " + std::to_string(start) + " + n) within the " + input_.to_string() +
                      " the model was built for, got " + x.shape().to_string());
  lend(a.states_.back()->y, nullptr, a.lent_y_);
  return decode_chain(ctx, layers_, a.states_, x, start);
}

const tensor& model::forward_layer(const kernels::context& ctx, const tensor& x, std::size_t i, bool training) {
  require_built("forward_layer");
  if (i >= layers_.size())
    throw error("forward_layer: layer " + std::to_string(i) + " of a model of " + std::to_string(layers_.size()) +
                " layers");
  if (i == 0) check_input(x);
  return layers_[i]->forward(ctx, x, training, *own_activations().states_[i]);
}

const tensor& model::backward(const kernels::context& ctx, const tensor& dout) {
  return backward(ctx, dout, own_activations());
}

const tensor& model::backward_part(const kernels::context& ctx, const tensor& dout, std::size_t i, std::size_t part) {
  require_built("backward_part");
  if (i >= layers_.size() || part >= layers_[i]->backward_parts())
    throw error("backward_part: part " + std::to_string(part) + " of layer " + std::to_string(i) + " of a model of " +
                std::to_string(layers_.size()) + " layers");
  activations& a = own_activations();
  if (i + 1 == layers_.size() && part + 1 == layers_[i]->backward_parts())
    lend(a.states_.front()->dx, nullptr, a.lent_dx_);  // as backward() begins
  return layers_[i]->backward_part(ctx, dout, *a.states_[i], part);
}

std::size_t model::layer_backward_parts(std::size_t i) const { return layers_.at(i)->backward_parts(); }

bool model::layer_needs_input_grad(std::size_t i) const { return layers_.at(i)->needs_input_grad(); }

const tensor& model::backward(const kernels::context& ctx, const tensor& dout, activations& a, tensor* dx) {
  require_built("backward");
  check_activations(a, "backward");
  lend(a.states_.front()->dx, dx, a.lent_dx_);
  return into(backward_chain(ctx, layers_, a.states_, dout), dx, "backward");
}

model::layer_profile model::profile() const {
  require_built("profile");
  layer_profile out;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    int64_t params = 0;
    const auto ps = layers_[i]->parameters();
    for (parameter* p : ps) params += p->value.numel();
    const shape& y = shapes_[i];
    // A layer over [c, h, w] reuses its weights at every output position.
    const int64_t positions = y.rank() == 3 ? y[1] * y[2] : 1;
    out.tensors.push_back(static_cast<int>(ps.size()));
    out.costs.push_back(params > 0 ? params * positions : y.numel());
    out.param_bytes.push_back(params * static_cast<int64_t>(sizeof(float)));
    out.output_elems.push_back(y.numel());
  }
  return out;
}

model model::slice(std::size_t first, std::size_t last) {
  require_built("slice");
  if (first >= last || last > layers_.size())
    throw error("model::slice: layers [" + std::to_string(first) + ", " + std::to_string(last) +
                ") of a model of " + std::to_string(layers_.size()) + " layers");
  model out;  // the parameters keep the names build() gave them: their layers' indices in the whole model
  out.first_ = first_ + first;
  out.input_ = first == 0 ? input_ : shapes_[first - 1];
  for (std::size_t i = first; i < last; ++i) {
    out.layers_.push_back(std::move(layers_[i]));
    out.shapes_.push_back(shapes_[i]);
  }
  // A stage after the first sends d(loss)/d(its input) back: every layer computes its input gradient.
  if (out.first_ > 0)
    for (auto& l : out.layers_) l->set_needs_input_grad(true);
  fuse_chain(out.layers_);  // a stage's last layer applies no ReLU of the next stage
  out.built_ = true;
  layers_.clear();
  shapes_.clear();
  own_ = activations();
  built_ = false;
  return out;
}

void model::name_parameters() {
  for (std::size_t i = 0; i < layers_.size(); ++i)
    for (parameter* p : layers_[i]->parameters()) {
      // Names carry the layer's index in the whole model: "0.conv2d.weight".
      const std::string prefix = std::to_string(first_ + i) + "." + layers_[i]->kind() + ".";
      if (p->name.rfind(prefix, 0) != 0) p->name = prefix + p->name;
    }
}

std::vector<parameter*> model::parameters() {
  require_built("parameters");
  std::vector<parameter*> out;
  for (auto& l : layers_)
    for (parameter* p : l->parameters()) out.push_back(p);
  return out;
}

param_layout model::layout() {
  std::vector<std::pair<std::string, shape>> tensors;
  for (parameter* p : parameters()) tensors.emplace_back(p->name, p->value.shape());
  return param_layout(tensors);
}

model::flat_buffers model::flatten() {
  const param_layout l = layout();
  flat_buffers out{tensor::empty({l.numel()}), tensor::zeros({l.numel()})};
  const std::vector<parameter*> ps = parameters();
  for (std::size_t i = 0; i < ps.size(); ++i) {
    const layout_entry& e = l[i];
    tensor v = out.values.slice(e.offset, e.offset + e.numel()).reshape(e.dims);
    v.copy_from(ps[i]->value);
    ps[i]->value = v;
    ps[i]->grad = out.grads.slice(e.offset, e.offset + e.numel()).reshape(e.dims);
  }
  return out;
}

void model::bind(const float* values, float* grads) {
  // layout()'s offsets, without building it (a stage binds before every action): one tensor after another.
  int64_t at = 0;
  for (parameter* p : parameters()) {
    const shape s = p->value.shape();
    p->value = tensor::wrap_read_only(s, values + at);
    p->grad = tensor::wrap(s, grads + at);
    at += s.numel();
  }
}

std::vector<named_tensor> model::state() {
  std::vector<named_tensor> out;
  for (parameter* p : parameters()) out.push_back({p->name, p->value});
  for (std::size_t i = 0; i < layers_.size(); ++i)
    for (auto& b : layers_[i]->buffers())
      out.push_back({std::to_string(first_ + i) + "." + layers_[i]->kind() + "." + b.name, b.value});
  return out;
}

void model::load_state(const std::string& arch, const std::vector<named_tensor>& entries) {
  require_built("load_state");
  if (arch != architecture())
    throw error("checkpoint is for another architecture:\n  checkpoint: " + arch + "\n  this model: " +
                architecture());
  std::map<std::string, const tensor*> by_name;
  for (auto& e : entries) by_name[e.name] = &e.value;
  for (auto& mine : state()) {
    auto it = by_name.find(mine.name);
    if (it == by_name.end()) throw error("checkpoint has no entry for " + mine.name);
    if (it->second->shape() != mine.value.shape())
      throw error("checkpoint entry " + mine.name + " has shape " + it->second->shape().to_string() +
                  ", the model needs " + mine.value.shape().to_string());
  }
  for (auto& mine : state()) mine.value.copy_from(*by_name[mine.name]);
}

std::string model::summary() const {
  require_built("summary");
  std::ostringstream os;
  os << std::left << std::setw(4) << "#" << std::setw(34) << "layer" << std::setw(18) << "output"
     << "params\n";
  os << std::setw(4) << "" << std::setw(34) << "input" << std::setw(18) << input_.to_string() << "\n";
  int64_t total = 0;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    int64_t n = 0;
    for (parameter* p : layers_[i]->parameters()) n += p->value.numel();
    total += n;
    const std::vector<layer::inner_layer> inner = layers_[i]->inner_layers();
    // A block's line gives its kind; the layers inside it follow, indented.
    os << std::setw(4) << (i + 1) << std::setw(34) << (inner.empty() ? layers_[i]->describe() : layers_[i]->kind())
       << std::setw(18) << shapes_[i].to_string() << n << "\n";
    for (const auto& in : inner) {
      int64_t m = 0;
      for (parameter* p : in.inner->parameters()) m += p->value.numel();
      os << std::setw(4) << "" << std::setw(52) << ("  " + in.place + ": " + in.inner->describe()) << m << "\n";
    }
  }
  os << "total parameters: " << total << " (" << std::fixed << std::setprecision(2)
     << total * 4.0 / (1024.0 * 1024.0) << " MiB)\n";
  return os.str();
}

std::string model::architecture() const {
  require_built("architecture");
  std::ostringstream os;
  os << "input" << input_.to_string();
  for (std::size_t i = 0; i < layers_.size(); ++i) os << " | " << layers_[i]->describe();
  return os.str();
}

int64_t model::num_parameters() const {
  int64_t total = 0;
  for (auto& l : layers_)
    for (parameter* p : l->parameters()) total += p->value.numel();
  return total;
}

const shape& model::output_shape() const {
  require_built("output_shape");
  return shapes_.back();
}

} // namespace troupe::model
