#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/cpu/gemm_own.hpp"
#include "kernels/cpu/simd_set.hpp"
#include "kernels/machine.hpp"
#include "tensor/error.hpp"

namespace troupe::kernels {

namespace {

/// cpuid's vendor, family and model into f (left empty and 0 where cpuid is absent).
void identify(cpu_features& f) {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return;
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  f.vendor = vendor;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return;
  const int base_family = (a >> 8) & 0xf, base_model = (a >> 4) & 0xf;
  f.family = base_family + (base_family == 0xf ? static_cast<int>((a >> 20) & 0xff) : 0);
  f.model = base_model | (base_family == 0xf || base_family == 6 ? static_cast<int>((a >> 16) & 0xf) << 4 : 0);
#else
  (void)f;
#endif
}

cpu_features detect() {
  cpu_features f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // libgcc's checks include the OS's support (XCR0) for the wider registers.
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512 = f.avx512f && __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#endif
  identify(f);
  f.full_rate_avx512 = f.avx512 && f.vendor == "AuthenticAMD" && f.family == 0x1a && f.model < 0x20;
  return f;
}

/// A size such as "32K" or "1024K" in /sys/devices/system/cpu/cpu0/cache/indexN/size, in bytes; 0 if absent.
long sys_cache_size(int level, bool data) {
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream lv(dir + "level"), ty(dir + "type"), sz(dir + "size");
    int l = 0;
    std::string type, size;
    if (!(lv >> l) || !(ty >> type) || !(sz >> size)) continue;
    if (l != level || (data && type == "Instruction") || (!data && type == "Data")) continue;
    long v = std::atol(size.c_str());
    if (size.back() == 'K') v *= 1024;
    if (size.back() == 'M') v *= 1024 * 1024;
    if (v > 0) return v;
  }
  return 0;
}

/// /sys first (sysconf's L3 is wrong in some virtual machines), then sysconf, then the default.
long cache_size(int level, long fallback) {
  long v = sys_cache_size(level, level == 1);
#ifdef _SC_LEVEL1_DCACHE_SIZE
  const int names[] = {_SC_LEVEL1_DCACHE_SIZE, _SC_LEVEL2_CACHE_SIZE, _SC_LEVEL3_CACHE_SIZE};
  if (v <= 0) v = sysconf(names[level - 1]);
#endif
  return v > 0 ? v : fallback;
}

/// A kernel set: its name and what it runs, GEMM and the vector kernels.
struct kernel_set {
  const char* name;
  const detail::gemm_kernel_set* gemm;
  const detail::simd_kernel_set* simd;
};

/// The sets this CPU runs, widest first.
std::vector<kernel_set> runnable_sets() {
  std::vector<kernel_set> sets;
  const bool avx2 = cpu().avx2 && cpu().fma && detail::avx2_gemm_kernels();
  if (avx2 && cpu().avx512 && detail::avx512_gemm_kernels())
    sets.push_back({"avx512", detail::avx512_gemm_kernels(), &detail::avx512::simd_kernels()});
  if (avx2) sets.push_back({"avx2+fma", detail::avx2_gemm_kernels(), &detail::avx2::simd_kernels()});
  sets.push_back({"generic", &detail::generic_gemm_kernels(), &detail::generic::simd_kernels()});
  return sets;
}

kernel_set choose() {
  const auto sets = runnable_sets();
  const char* cap = std::getenv("TROUPE_CPU_KERNELS");
  if (!cap || !*cap) return sets.front();
  std::string names;
  for (const auto& s : sets) {
    if (s.name == std::string(cap)) return s;
    names += names.empty() ? s.name : std::string(", ") + s.name;
  }
  throw error(std::string("TROUPE_CPU_KERNELS=") + cap + ": this CPU runs the kernel sets " + names +
              "; set one of them or unset the variable");
}

/// The set of this process, chosen once.
const kernel_set& active() {
  static const kernel_set s = choose();
  return s;
}

} // namespace

const cpu_features& cpu() {
  static const cpu_features f = detect();
  return f;
}

const cache_sizes& caches() {
  static const cache_sizes c = [] {
    cache_sizes s;
    s.l1d = cache_size(1, s.l1d);
    s.l2 = cache_size(2, s.l2);
    s.l3 = cache_size(3, s.l3);
    return s;
  }();
  return c;
}

std::string cpu_kernels_name() { return active().name; }

std::vector<std::string> cpu_kernel_sets() {
  std::vector<std::string> names;
  for (const auto& s : runnable_sets()) names.push_back(s.name);
  return names;
}

namespace detail {

const gemm_kernel_set* const* runnable_gemm_kernels(int& count) {
  static const std::vector<const gemm_kernel_set*> sets = [] {
    std::vector<const gemm_kernel_set*> g;
    for (const auto& s : runnable_sets())
      if (std::find(g.begin(), g.end(), s.gemm) == g.end()) g.push_back(s.gemm);
    return g;
  }();
  count = static_cast<int>(sets.size());
  return sets.data();
}

const gemm_kernel_set& active_gemm_kernels() { return *active().gemm; }

const simd_kernel_set& active_simd_kernels() { return *active().simd; }

std::vector<std::pair<std::string, const simd_kernel_set*>> runnable_simd_kernels() {
  std::vector<std::pair<std::string, const simd_kernel_set*>> out;
  for (const auto& s : runnable_sets()) out.emplace_back(s.name, s.simd);
  return out;
}

} // namespace detail

} // namespace troupe::kernels
