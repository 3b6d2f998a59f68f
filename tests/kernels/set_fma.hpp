#pragma once

// Which kernel sets fuse a * b + c into an FMA, for the tests that hold a set to
// the bits of a scalar model: the wider sets are compiled with -mfma (avx2+fma)
// or AVX-512, generic with the baseline's flags, which the tests share
// (x86-64-v3, the default, has FMA; x86-64-v2 has not).

#include <string>

namespace troupe::testing {

/// Whether this file's compiler contracts a * b + c into an FMA (it does where the baseline has FMA).
#ifdef __FMA__
inline constexpr bool tests_fuse = true;
#else
inline constexpr bool tests_fuse = false;
#endif

/// Whether kernel set `set` (its cpu_kernel_sets() name) fuses a * b + c.
inline bool set_fuses(const std::string& set) { return tests_fuse || set != "generic"; }

} // namespace troupe::testing
