#pragma once

// What the CPU running this process offers troupe's kernels: its instruction
// sets (cpuid, read once when first asked), its cache sizes, the kernel set
// chosen from them, and a probe of its fused multiply-add throughput, so that
// every kernel's speed can be given as a fraction of the machine's peak.

#include <string>
#include <vector>

namespace troupe::kernels {

/// Instruction sets the CPU (and the OS) support, from cpuid.
struct cpu_features {
  bool avx2 = false, fma = false, avx512f = false;
  /// AVX-512 F, CD, BW, DQ and VL (x86-64-v4): what the "avx512" kernel set is compiled for.
  bool avx512 = false;
  /// A core that issues two 512-bit FMAs a cycle, twice its 256-bit rate, so
  /// that the "avx512" GEMM kernel runs at twice the AVX2 one's speed. From
  /// cpuid's vendor, family and model, for the parts measured so: AMD family
  /// 1Ah models 00h-1Fh (Zen 5 EPYC). False elsewhere, also where it may be
  /// true but was not measured (Intel's server cores, Zen 5 desktop parts),
  /// and on Zen 4, whose 512-bit FMAs issue at the 256-bit rate.
  bool full_rate_avx512 = false;
  /// cpuid's vendor string ("AuthenticAMD", "GenuineIntel"), family and model (extended fields added).
  std::string vendor;
  int family = 0, model = 0;
};
/// This CPU's features, detected once.
const cpu_features& cpu();

/// Data cache sizes in bytes, per core for L1 and L2 and in all for L3, as
/// /sys (else sysconf) reports them; the usual sizes where neither does.
struct cache_sizes {
  long l1d = 32 * 1024, l2 = 512 * 1024, l3 = 8 * 1024 * 1024;
};
/// This machine's caches, read once.
const cache_sizes& caches();

/// The kernel set troupe's own kernels (GEMM, direct and Winograd
/// convolutions, pooling) use in this process, by name: "avx512", "avx2+fma"
/// or "generic" (plain C++ and SSE vectors). Chosen once from cpu(): the
/// widest set the CPU has. The environment variable
/// TROUPE_CPU_KERNELS (a name of cpu_kernel_sets()) caps it, e.g. to test the
/// generic kernels on an AVX2 machine; a name the CPU cannot run is an error.
std::string cpu_kernels_name();
/// The names of every kernel set this CPU can run, widest first.
std::vector<std::string> cpu_kernel_sets();

/// The measured fused multiply-add throughput of `threads` threads, in
/// GFLOP/s (2 flops per lane): each thread runs independent chains of FMAs
/// on vectors of `width` floats (4: SSE-wide FMA, 8: AVX2, 16: AVX-512) for
/// about `seconds`. Throws troupe::error for a width the CPU lacks, a thread
/// count below 1 or a duration outside (0, 10] s.
double fma_peak_gflops(int threads, int width, double seconds = 0.2);

} // namespace troupe::kernels
