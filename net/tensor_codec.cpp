#include "net/tensor_codec.hpp"

#include "net/message.hpp"

#include <cstring>

namespace troupe::net {

namespace {

constexpr uint64_t max_blob = (uint64_t(1) << 29) - 1;  // Cap'n Proto lists and blobs hold fewer than 2^29 elements

void check_blob(const shape& s) {
  if (uint64_t(s.numel()) * sizeof(float) > max_blob)
    throw error("encode: tensor " + s.to_string() + " is " + std::to_string(s.numel() * sizeof(float)) +
                " bytes; one Cap'n Proto blob holds at most " + std::to_string(max_blob) + " bytes");
}

void init_shape(const shape& s, wire::Tensor::Builder b) {
  auto dims = b.initShape(static_cast<unsigned>(s.rank()));
  for (std::size_t i = 0; i < s.rank(); ++i) dims.set(static_cast<unsigned>(i), s[i]);
  b.setDtype(wire::DType::F32);
}

/// The start of the payloads when each non-empty one begins where the one before ends.
template <typename P>
P adjacent(const std::vector<P>& ps, const std::vector<int64_t>& numel) {
  P base = nullptr, next = nullptr;
  for (std::size_t i = 0; i < ps.size(); ++i) {
    if (numel[i] == 0) continue;
    if (!base) base = ps[i];
    else if (ps[i] != next) return nullptr;
    next = ps[i] + numel[i];
  }
  return base;
}

} // namespace

void encode(const tensor& t, wire::Tensor::Builder b) {
  if (t.dev().kind != device_kind::cpu) throw error("encode: only cpu tensors can be encoded, got " + to_string(t.dev()));
  encode(t.shape(), t.data(), b);
}

void encode(const shape& s, const float* src, wire::Tensor::Builder b) {
  float* dst = init_tensor(s, b);
  if (s.numel() > 0) std::memcpy(dst, src, static_cast<std::size_t>(s.numel()) * sizeof(float));
}

std::vector<float*> init_tensors(capnp::List<wire::Tensor>::Builder list, const std::vector<shape>& shapes) {
  if (list.size() != shapes.size()) throw error("init_tensors: " + std::to_string(list.size()) + " tensors for " +
                                                std::to_string(shapes.size()) + " shapes");
  for (const auto& s : shapes) check_blob(s);
  for (unsigned i = 0; i < list.size(); ++i) init_shape(shapes[i], list[i]);  // every payload after every shape
  std::vector<float*> out;
  for (unsigned i = 0; i < list.size(); ++i)
    out.push_back(reinterpret_cast<float*>(list[i].initData(static_cast<unsigned>(shapes[i].numel() * sizeof(float))).begin()));
  return out;
}

float* init_tensor(const shape& s, wire::Tensor::Builder b) {
  check_blob(s);
  init_shape(s, b);
  return reinterpret_cast<float*>(b.initData(static_cast<unsigned>(s.numel() * sizeof(float))).begin());
}

std::vector<float*> payloads(capnp::List<wire::Tensor>::Builder list) {
  std::vector<float*> out;
  for (auto t : list) out.push_back(reinterpret_cast<float*>(t.getData().begin()));
  return out;
}

const float* flat_payload(capnp::List<wire::Tensor>::Reader list, const std::string& what) {
  std::vector<const float*> ps;
  std::vector<int64_t> numel;
  for (auto t : list) {
    tensor_view v = view(t, what);
    ps.push_back(v.data);
    numel.push_back(v.numel());
  }
  return adjacent(ps, numel);
}

float* flat_payload(const std::vector<float*>& ps, const std::vector<shape>& shapes) {
  std::vector<int64_t> numel;
  for (const auto& s : shapes) numel.push_back(s.numel());
  return adjacent(ps, numel);
}

tensor decode(wire::Tensor::Reader r, const std::string& what) {
  // view() validates dtype, dimensions and payload size; the payload, at most
  // 2^29 bytes, bounds the element count.
  tensor_view v = view(r, what);
  tensor t = tensor::empty(v.dims);
  if (v.numel() > 0) std::memcpy(t.data(), v.data, static_cast<std::size_t>(v.numel()) * sizeof(float));
  return t;
}

void encode(const std::vector<named_tensor>& ts, capnp::List<wire::NamedTensor>::Builder b) {
  for (std::size_t i = 0; i < ts.size(); ++i) {
    b[static_cast<unsigned>(i)].setName(ts[i].name);
    try {
      encode(ts[i].value, b[static_cast<unsigned>(i)].initTensor());
    } catch (const error& e) {
      throw error(ts[i].name + ": " + e.what());
    }
  }
}

std::vector<named_tensor> decode(capnp::List<wire::NamedTensor>::Reader r, const std::string& what) {
  std::vector<named_tensor> out;
  out.reserve(r.size());
  for (auto e : r) {
    std::string name = e.getName();
    out.push_back({name, decode(e.getTensor(), what + " entry " + name)});
  }
  return out;
}

} // namespace troupe::net
