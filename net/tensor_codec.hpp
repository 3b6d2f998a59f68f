#pragma once

// tensor <-> Cap'n Proto. Readers copy into troupe tensors (checkpoints) or
// view the bytes in place.

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

/// Initializes list[i] as an f32 tensor of shape shapes[i], for every i: every
/// shape first, then every payload, so that the payloads follow one another in
/// the segment (adjacent when each is a whole number of 8-byte words). Returns
/// each payload (zeroed), to be written in place.
std::vector<float*> init_tensors(capnp::List<wire::Tensor>::Builder list, const std::vector<shape>& shapes);
/// Initializes `b` as an f32 tensor of shape `s`; returns its payload (zeroed), to be written in place.
float* init_tensor(const shape& s, wire::Tensor::Builder b);
/// The payloads of `list` (a message being built or edited in place).
std::vector<float*> payloads(capnp::List<wire::Tensor>::Builder list);
/// The payloads of `list` as one flat array, when they lie one after another in
/// memory (as init_tensors lays them out); nullptr when they do not (read them
/// one by one). Throws message_error (bad_tensor) like view().
const float* flat_payload(capnp::List<wire::Tensor>::Reader list, const std::string& what);
/// The start of the flat array `ps` (of tensors of shapes `shapes`) form when
/// adjacent, else nullptr.
float* flat_payload(const std::vector<float*>& ps, const std::vector<shape>& shapes);

void encode(const std::vector<named_tensor>& ts, capnp::List<wire::NamedTensor>::Builder b);
std::vector<named_tensor> decode(capnp::List<wire::NamedTensor>::Reader r, const std::string& what);

} // namespace troupe::net
