#include <algorithm>
#include <string>
#include <thread>

#include "kernels/kernels.hpp"

namespace troupe::kernels {

context context::all_cores() {
  context c;
  c.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return c;
}

context context::with_threads(int n) {
  if (n < 0)
    throw error("kernel threads: " + std::to_string(n) +
                " is negative; give a thread count >= 1, or 0 for every core");
  if (n == 0) return all_cores();
  context c;
  c.threads = n;
  return c;
}

const char* to_string(gemm_backend b) {
  switch (b) {
    case gemm_backend::automatic: return "auto";
    case gemm_backend::openblas: return "openblas";
    case gemm_backend::eigen: return "eigen";
    case gemm_backend::own: return "own";
  }
  return "unknown";
}

gemm_backend parse_gemm_backend(const std::string& name) {
  for (gemm_backend b : {gemm_backend::automatic, gemm_backend::openblas, gemm_backend::eigen, gemm_backend::own})
    if (name == to_string(b)) return b;
  throw error("gemm backend '" + name + "': give auto, openblas, eigen or own");
}

void ensure_shape(tensor& t, const shape& s) {
  if (t.defined() && t.shape() == s && t.dev().kind == device_kind::cpu) return;
  if (t.defined() && t.numel() == s.numel() && t.dev().kind == device_kind::cpu) {
    t = t.reshape(s);
    return;
  }
  t = tensor::empty(s);
}

} // namespace troupe::kernels
