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

} // namespace

void encode(const tensor& t, wire::Tensor::Builder b) {
  if (t.dev().kind != device_kind::cpu) throw error("encode: only cpu tensors can be encoded, got " + to_string(t.dev()));
  encode(t.shape(), t.data(), b);
}

void encode(const shape& s, const float* src, wire::Tensor::Builder b) {
  float* dst = init_tensor(s, b);
  if (s.numel() > 0) std::memcpy(dst, src, static_cast<std::size_t>(s.numel()) * sizeof(float));
}

float* init_tensor(const shape& s, wire::Tensor::Builder b) {
  check_blob(s);
  init_shape(s, b);
  return reinterpret_cast<float*>(b.initData(static_cast<unsigned>(s.numel() * sizeof(float))).begin());
}

float* init_tensor(capnp::MessageBuilder& msg, const shape& s, wire::Tensor::Builder b, std::shared_ptr<const void>& keep) {
  check_blob(s);
  init_shape(s, b);
  return reinterpret_cast<float*>(written_blob(
      msg, static_cast<std::size_t>(s.numel()) * sizeof(float), keep,
      [&](std::size_t n) { return b.initData(static_cast<unsigned>(n)); },
      [&](capnp::Orphan<capnp::Data>&& o) { b.adoptData(kj::mv(o)); }));
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
