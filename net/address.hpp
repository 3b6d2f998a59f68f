#pragma once

// Who a message is from and for: (node, role, index). Every envelope carries
// its source and destination as addresses; a directory maps an address to a
// local actor (or, across nodes, to the proxy of the node that hosts it).

#include <cstdint>
#include <functional>
#include <string>

namespace troupe::net {

/// The roles of a run. Indices count per role from 0.
enum class role : uint8_t { coordinator, loader, worker, shard, stage, evaluator, node };
constexpr int roles = 7;

/// "coordinator", "loader", ...
const char* to_string(role r);

struct address {
  uint32_t node = 0;
  net::role role = net::role::coordinator;
  uint32_t index = 0;

  bool operator==(const address& o) const { return node == o.node && role == o.role && index == o.index; }
  bool operator!=(const address& o) const { return !(*this == o); }
  bool operator<(const address& o) const {
    if (node != o.node) return node < o.node;
    if (role != o.role) return role < o.role;
    return index < o.index;
  }
};

/// "worker 3 on node 0"
std::string to_string(const address& a);

inline address coordinator_address(uint32_t node = 0) { return {node, role::coordinator, 0}; }

} // namespace troupe::net

template <>
struct std::hash<troupe::net::address> {
  std::size_t operator()(const troupe::net::address& a) const noexcept {
    return (static_cast<std::size_t>(a.node) << 40) ^ (static_cast<std::size_t>(a.role) << 32) ^ a.index;
  }
};
