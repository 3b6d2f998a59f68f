#include "tensor/error.hpp"

namespace troupe {

failure failure_of(const std::exception& e) {
  if (dynamic_cast<const diverged_error*>(&e)) return failure::diverged;
  if (dynamic_cast<const bad_message_error*>(&e)) return failure::bad_message;
  if (dynamic_cast<const lost_node_error*>(&e)) return failure::lost_node;
  if (dynamic_cast<const timeout_error*>(&e)) return failure::timeout;
  return failure::other;
}

void throw_failure(failure f, const std::string& what) {
  switch (f) {
    case failure::diverged: throw diverged_error(what);
    case failure::bad_message: throw bad_message_error(what);
    case failure::lost_node: throw lost_node_error(what);
    case failure::timeout: throw timeout_error(what);
    case failure::other: break;
  }
  throw error(what);
}

failure failure_from(unsigned value) {
  return value <= static_cast<unsigned>(failure::timeout) ? static_cast<failure>(value) : failure::other;
}

const char* to_string(failure f) {
  switch (f) {
    case failure::diverged: return "diverged";
    case failure::bad_message: return "bad message";
    case failure::lost_node: return "lost node";
    case failure::timeout: return "timeout";
    case failure::other: break;
  }
  return "error";
}

int exit_status(failure f) {
  switch (f) {
    case failure::diverged: return 3;
    case failure::bad_message: return 4;
    case failure::lost_node: return 5;
    case failure::timeout: return 6;
    case failure::other: break;
  }
  return 1;
}

} // namespace troupe
