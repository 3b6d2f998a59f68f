#pragma once

// splitmix64, dropout_forward's counter-based hash: a mask is reproducible
// from (seed, counter), and element i of a call hashes base + i. One
// definition for elementwise.cpp (the base) and elementwise_set.cpp (each
// element, on a uint64_t or lane by lane on GCC's vector of them), so that the
// two agree. In an unnamed namespace: each kernel set compiles its own copy
// with its own instruction set, never merged with another set's.

#include <cstdint>

namespace troupe::kernels::detail {
namespace {

template <class U>
inline U splitmix(U z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

} // namespace
} // namespace troupe::kernels::detail
