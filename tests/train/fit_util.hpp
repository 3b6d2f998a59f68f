#pragma once

// A helper of the tests that run fit(job): each step's loss.

#include <sstream>
#include <vector>

#include "actors/fit.hpp"

namespace troupe::testing {

/// The losses of `j`'s steps, in the order reported; its history in `h` and
/// its log in `log` when given (else the log is dropped).
inline std::vector<double> losses_of(job j, history* h = nullptr, std::ostream* log = nullptr) {
  std::vector<double> losses;
  j.on_step([&](const step_event& e) { losses.push_back(e.loss); });
  std::ostringstream dropped;
  history out = fit(j, log ? *log : dropped);
  if (h) *h = std::move(out);
  return losses;
}

} // namespace troupe::testing
