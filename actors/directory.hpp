#pragma once

// The directory of a node: address -> the actor that serves it. In one
// process every address is a local actor; a cluster (later) maps the
// addresses of other nodes to the proxy of their node. Senders never know which.
// Including this costs a CAF compile: only actor code does.

#include <caf/actor.hpp>
#include <caf/send.hpp>

#include <memory>
#include <unordered_map>

#include "net/address.hpp"
#include "net/message.hpp"
#include "tensor/error.hpp"

// A net::message is immutable and shared by reference: safe to pass between
// actors of one process as it is.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::net::message)

namespace troupe::actors {

/// Filled while a node starts, read-only once training runs (the start
/// message orders the fill before every lookup).
class directory {
public:
  void add(const net::address& a, caf::actor h) { actors_[a] = std::move(h); }
  /// The actor serving `a`; throws troupe::error for an address nobody serves.
  const caf::actor& at(const net::address& a) const {
    auto it = actors_.find(a);
    if (it == actors_.end()) throw error("directory: no actor serves " + net::to_string(a));
    return it->second;
  }
  const std::unordered_map<net::address, caf::actor>& all() const { return actors_; }

private:
  std::unordered_map<net::address, caf::actor> actors_;
};

/// Sends `m` to the actor serving `to`. The sender knows the destination: the
/// envelope says the same, or names the first of several recipients of one
/// shared message. Who sent it is in the envelope, not in CAF's sender.
inline void send_to(const directory& d, const net::address& to, net::message m) {
  caf::anon_send(d.at(to), std::move(m));
}

/// Sends `m` to the destination its envelope names.
inline void deliver(const directory& d, net::message m) {
  const net::address to = net::read_header(m).destination;
  send_to(d, to, std::move(m));
}

} // namespace troupe::actors
