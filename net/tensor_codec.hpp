#pragma once

// tensor <-> Cap'n Proto. Readers copy into troupe tensors (checkpoints) or
// view the bytes in place.

#include <capnp/message.h>

#include <memory>
#include <string>
#include <vector>

#include "net/tensor.capnp.h"
#include "tensor/tensor.hpp"

namespace troupe::net {

/// Writes `t` (a CPU tensor) into `b`; the payload is built in place.
void encode(const tensor& t, wire::Tensor::Builder b);
/// Writes `s.numel()` floats from `data` as a tensor of shape `s`.
void encode(const shape& s, const float* data, wire::Tensor::Builder b);
/// A CPU tensor holding a copy of `r`. Throws troupe::error when the dtype is
/// unknown or the payload size does not match the shape; `what` names the
/// tensor in the message.
tensor decode(wire::Tensor::Reader r, const std::string& what);

/// Initializes `b` as an f32 tensor of shape `s`; returns its payload (zeroed), to be written in place.
float* init_tensor(const shape& s, wire::Tensor::Builder b);
/// The same for a payload the caller writes whole (not zeroed): a large one
/// is `msg`'s external blob, kept in `keep` (net::written_blob).
float* init_tensor(capnp::MessageBuilder& msg, const shape& s, wire::Tensor::Builder b, std::shared_ptr<const void>& keep);

void encode(const std::vector<named_tensor>& ts, capnp::List<wire::NamedTensor>::Builder b);
std::vector<named_tensor> decode(capnp::List<wire::NamedTensor>::Reader r, const std::string& what);

} // namespace troupe::net
