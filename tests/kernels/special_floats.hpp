#pragma once

// The floats on which the kernel-set tests check IEEE cases (NaN, infinities,
// the largest and smallest floats), and a comparison bit for bit that takes
// any NaN for any other.

#include <cmath>
#include <cstring>
#include <limits>

namespace troupe::testing {

inline const float qnan = std::numeric_limits<float>::quiet_NaN();
inline const float inf_f = std::numeric_limits<float>::infinity();
inline const float big = std::numeric_limits<float>::max();
inline const float tiny = std::numeric_limits<float>::denorm_min();

/// got is want, bit for bit, or both are NaN.
inline bool same(float got, float want) {
  if (std::isnan(want)) return std::isnan(got);
  return std::memcmp(&got, &want, sizeof got) == 0;
}

} // namespace troupe::testing
