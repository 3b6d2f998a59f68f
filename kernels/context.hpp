#pragma once

#include "tensor/tensor.hpp"

namespace troupe::kernels {

/// Which implementation troupe's GEMM calls. OpenBLAS is the default: it
/// measured faster than Eigen's product on the reference machine (see
/// docs/benchmarks.md).
enum class gemm_backend { openblas, eigen };

/// How conv2d computes: direct kernels (the default), or im2col + GEMM, the
/// reference path the direct kernels are tested against (also taken for
/// geometries the direct kernels do not handle). Both give the same results
/// up to float rounding.
enum class conv_path { direct, im2col };

/// Where and how kernels run. Owned by whoever runs them (a worker, the
/// training loop, a test) and passed to every kernel; nothing global changes.
/// Later: the device and its stream.
struct context {
  int threads = 1;                              ///< >= 1
  gemm_backend gemm = gemm_backend::openblas;
  conv_path conv = conv_path::direct;
  device dev{};                                 ///< cpu only for now (tensor/tensor.hpp)

  /// threads = every core of the machine (std::thread::hardware_concurrency()).
  static context all_cores();
  /// n threads; 0 means all cores. Throws troupe::error for a negative n.
  static context with_threads(int n);
};

} // namespace troupe::kernels
