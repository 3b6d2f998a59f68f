#pragma once

// troupe's own SGEMM (gemm_backend::own): the blocked driver (gemm_own.cpp)
// and the kernel sets it runs on, one per instruction set, chosen when the
// process starts (machine.cpp). A new set (AVX-512, say) is one more
// gemm_kernel_set and one more line in machine.cpp's list.

#include <cstdint>
#include <string>

namespace troupe::kernels {
struct context;
}

namespace troupe::kernels::detail {

/// A register-blocked micro-kernel for one instruction set and the routines
/// that pack operands into the layout it reads.
struct gemm_kernel_set {
  const char* name;  ///< as cpu_kernels_name() reports it
  int mr, nr;        ///< the tile of C one micro-kernel call computes
  /// C[mr x nr] (row stride ldc) = alpha * sum_p a[p * mr + i] * b[p * nr + j]
  /// + beta * C, p < k; beta == 0 does not read C. a and b are packed
  /// panels (64-byte aligned b).
  void (*micro)(int64_t k, const float* a, const float* b, float* c, int64_t ldc, float alpha, float beta);
  /// op(A) [m x k] (element (i, p) at a[i * lda + p], or a[p * lda + i] when
  /// `trans`) into ceil(m / mr) panels of k * mr floats, rows past m zero.
  /// May write up to 16 floats past the last panel.
  void (*pack_a)(bool trans, const float* a, int64_t lda, int64_t m, int64_t k, float* dst);
  /// op(B) [k x n] (element (p, j) at b[p * ldb + j], or b[j * ldb + p] when
  /// `trans`) into ceil(n / nr) panels of k * nr floats, columns past n zero.
  void (*pack_b)(bool trans, const float* b, int64_t ldb, int64_t k, int64_t n, float* dst);
};

/// The packing every set can fall back on (edges): count rows of width
/// `width`, element (i, p) of the source at src[i * si + p * sp], into
/// ceil(count / width) panels, dst[panel][p * width + i], rows past count zero.
void pack_panels_ref(const float* src, int64_t si, int64_t sp, int64_t count, int64_t k, int width, float* dst);

/// Plain C++ for whatever the compiler targets: runs everywhere.
const gemm_kernel_set& generic_gemm_kernels();
/// AVX2 + FMA (6 x 16 tiles); null where the compiler cannot emit them.
const gemm_kernel_set* avx2_gemm_kernels();
/// AVX-512F (8 x 32 tiles; packing needs AVX2); null where the compiler cannot emit them.
const gemm_kernel_set* avx512_gemm_kernels();

/// Every GEMM set this CPU can run, widest first, each once (machine.cpp).
const gemm_kernel_set* const* runnable_gemm_kernels(int& count);
/// The GEMM set of the kernel set chosen for this process (machine.cpp,
/// cpu_kernels_name()): the widest runnable one, capped by TROUPE_CPU_KERNELS.
const gemm_kernel_set& active_gemm_kernels();

/// What a product does to C besides alpha * op(A) * op(B): every row of C
/// starts as `row_bias` (n floats; beta is then 1, C's old values are not
/// read), and `act` (y = f(x) over n floats, x == y allowed) runs over each
/// row after the product. gemm_own applies both on the thread that computes
/// each block of C, while the block is in its cache: a dense layer's bias and
/// ReLU with no pass of their own, in the same bits as a bias copied into C,
/// a product with beta 1, then the activation over C.
struct gemm_epilogue {
  const float* row_bias = nullptr;
  void (*act)(const float* x, float* y, int64_t n) = nullptr;

  /// Before the product on C [m x n] (row stride ldc): the bias into every row; true when it was (beta is then 1).
  bool start(int64_t m, int64_t n, float* c, int64_t ldc) const {
    if (!row_bias) return false;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = row_bias[j];
    return true;
  }
  /// After the product: the activation over every row.
  void finish(int64_t m, int64_t n, float* c, int64_t ldc) const {
    if (act)
      for (int64_t i = 0; i < m; ++i) act(c + i * ldc, c + i * ldc, n);
  }
};

/// Row-major C[m x n] = alpha * op(A) * op(B) + beta * C on kernel set `ks`,
/// with up to `threads` threads over blocks of C (one inside a parallel
/// region), then `epilogue`. beta == 0 does not read C.
void gemm_own(const gemm_kernel_set& ks, int threads, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
              float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc, const gemm_epilogue& epilogue = {});

/// kernels::gemm on ctx's backend (gemm.cpp), then `epilogue`: on the threads
/// of troupe's own kernels where they run the product, after it on this
/// thread where another backend does.
void gemm_then(const context& ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
               int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
               const gemm_epilogue& epilogue);

} // namespace troupe::kernels::detail
