#pragma once

#include <string>

#include "tensor/tensor.hpp"

namespace troupe::kernels {

/// Which implementation troupe's GEMM calls. `own` is troupe's own blocked
/// SGEMM, on the kernel set chosen for this CPU when the process starts
/// (kernels/machine.hpp); `automatic` (the default) chooses per product: own
/// where every dimension is at least 64 and the depth at most 1024 (where it
/// measured faster on the models' products, docs/benchmarks.md: the MLP's
/// and the CNN's dense layers but the CNN's 3136-deep forward product),
/// OpenBLAS otherwise (small and skinny products, the convolutions' GEMMs).
/// OpenBLAS measured faster than Eigen's product.
enum class gemm_backend { automatic, openblas, eigen, own };

/// "auto", "openblas", "eigen" or "own".
const char* to_string(gemm_backend b);
/// The backend named `name` (one of to_string's); throws troupe::error naming the choices.
gemm_backend parse_gemm_backend(const std::string& name);

/// How conv2d computes. `automatic` (the default): Winograd's F(2x2, 3x3) or
/// F(4x4, 3x3) (chosen by the output plane's size) for 3x3 stride-1 layers of
/// at least 8 input and output channels, the direct kernels for the other
/// strides 1 and 2 with kernels 1, 3, 5 and 7, im2col + GEMM for the rest. `winograd` and `direct` take that path wherever it
/// applies (the next one elsewhere); `im2col` is the reference every path is
/// tested against. All give the same results up to float rounding.
enum class conv_path { automatic, direct, winograd, im2col };

/// Where and how kernels run. Owned by whoever runs them (a worker, the
/// training loop, a test) and passed to every kernel; nothing global changes.
/// Later: the device and its stream.
struct context {
  int threads = 1;                              ///< >= 1
  gemm_backend gemm = gemm_backend::automatic;
  conv_path conv = conv_path::automatic;
  device dev{};                                 ///< cpu only for now (tensor/tensor.hpp)

  /// threads = every core of the machine (std::thread::hardware_concurrency()).
  static context all_cores();
  /// n threads; 0 means all cores. Throws troupe::error for a negative n.
  static context with_threads(int n);
};

} // namespace troupe::kernels
