#pragma once

#include <stdexcept>
#include <string>

namespace troupe {

/// The exception troupe throws: its message says what went wrong, where, and
/// how to fix it. The subclasses below say what kind of failure ended a run,
/// for a caller that handles them apart (fit throws them).
class error : public std::runtime_error {
public:
  explicit error(const std::string& what) : std::runtime_error(what) {}
};

/// A shape mismatch between a kernel's or layer's inputs.
class shape_error : public error {
public:
  explicit shape_error(const std::string& what) : error(what) {}
};

/// Training diverged: a loss or a value that is not finite.
class diverged_error : public error {
public:
  explicit diverged_error(const std::string& what) : error(what) {}
};

/// A message that could not be read or breaks the protocol (malformed,
/// oversized, of an unexpected kind, with NaN or Inf in its tensors).
class bad_message_error : public error {
public:
  explicit bad_message_error(const std::string& what) : error(what) {}
};

/// A node of a cluster run was lost (dead, frozen, unreachable) where the
/// run cannot go on without it.
class lost_node_error : public error {
public:
  explicit lost_node_error(const std::string& what) : error(what) {}
};

/// Something waited for (a node's join, a reply, progress) did not come in time.
class timeout_error : public error {
public:
  explicit timeout_error(const std::string& what) : error(what) {}
};

/// The kinds of failure above, as a value that crosses actors and nodes.
enum class failure : unsigned { other = 0, diverged = 1, bad_message = 2, lost_node = 3, timeout = 4 };

/// The kind of `e` (other for anything but the classes above).
failure failure_of(const std::exception& e);
/// Throws the class of `f` with `what`.
[[noreturn]] void throw_failure(failure f, const std::string& what);
/// A failure from its wire value; unknown values are `other`.
failure failure_from(unsigned value);
/// "diverged", "bad message", "lost node", "timeout", "error".
const char* to_string(failure f);
/// The trainer's exit status for `f`: 1 other, 3 diverged, 4 bad message, 5 lost node, 6 timeout
/// (0 is success, 2 a bad command line).
int exit_status(failure f);

} // namespace troupe
