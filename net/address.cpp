#include "net/address.hpp"

namespace troupe::net {

const char* to_string(role r) {
  switch (r) {
    case role::coordinator: return "coordinator";
    case role::loader: return "loader";
    case role::worker: return "worker";
    case role::shard: return "shard";
    case role::stage: return "stage";
    case role::evaluator: return "evaluator";
    case role::node: return "node";
  }
  return "unknown role";
}

std::string to_string(const address& a) {
  return std::string(to_string(a.role)) + " " + std::to_string(a.index) + " on node " + std::to_string(a.node);
}

} // namespace troupe::net
