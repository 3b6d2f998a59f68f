#include <omp.h>

#include <thread>

#include "kernels/kernels.hpp"

namespace troupe::kernels {

void set_num_threads(int n) {
  if (n <= 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // OpenBLAS's OpenMP build and Eigen both follow OpenMP's thread count.
  omp_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

void ensure_shape(tensor& t, const shape& s) {
  if (t.defined() && t.shape() == s && t.dev().kind == device_kind::cpu) return;
  if (t.defined() && t.numel() == s.numel() && t.dev().kind == device_kind::cpu) {
    t = t.reshape(s);
    return;
  }
  t = tensor::empty(s);
}

} // namespace troupe::kernels
