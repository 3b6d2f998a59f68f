#pragma once

#include <stdexcept>
#include <string>

namespace troupe {

/// The one exception type troupe throws: its message says what went wrong,
/// where, and how to fix it.
class error : public std::runtime_error {
public:
  explicit error(const std::string& what) : std::runtime_error(what) {}
};

/// A shape mismatch between a kernel's or layer's inputs.
class shape_error : public error {
public:
  explicit shape_error(const std::string& what) : error(what) {}
};

} // namespace troupe
