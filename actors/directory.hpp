#pragma once

// The directory of a node: address -> the actor that serves it. Addresses
// hosted on this node map to local actors; those of another node go through
// the link to that node (its proxy), which writes the message on the wire.
// Senders never know which. Including this costs a CAF compile: only actor
// code does.

#include <caf/actor.hpp>
#include <caf/send.hpp>

#include <functional>
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
  /// Sends a message to an address of another node; a lower priority
  /// overtakes what waits for the same link (net::transport::send).
  using remote_sender = std::function<void(const net::address& to, const net::message& m, int priority)>;

  void add(const net::address& a, caf::actor h) { actors_[a] = std::move(h); }
  /// Every address of node `node` (not hosted here) goes through `send`.
  void add_remote(uint32_t node, remote_sender send) { remote_[node] = std::move(send); }

  /// The local actor serving `a`, or nullptr when `a` is not hosted here.
  const caf::actor* local(const net::address& a) const {
    auto it = actors_.find(a);
    return it == actors_.end() ? nullptr : &it->second;
  }
  /// Sends `m` to `a`: to its local actor, or through the link to its node
  /// with `priority`. Throws troupe::error for an address nobody serves.
  void send(const net::address& a, net::message m, int priority = 0) const {
    if (const caf::actor* h = local(a)) {
      caf::anon_send(*h, std::move(m));
      return;
    }
    auto it = remote_.find(a.node);
    if (it == remote_.end()) throw error("directory: no actor serves " + net::to_string(a));
    it->second(a, m, priority);
  }
  /// The local actors.
  const std::unordered_map<net::address, caf::actor>& locals() const { return actors_; }

private:
  std::unordered_map<net::address, caf::actor> actors_;
  std::unordered_map<uint32_t, remote_sender> remote_;
};

/// Sends `m` to `to`. The sender knows the destination: the envelope says the
/// same, or names the first of several recipients of one shared message. Who
/// sent it is in the envelope, not in CAF's sender.
inline void send_to(const directory& d, const net::address& to, net::message m, int priority = 0) {
  d.send(to, std::move(m), priority);
}

/// Sends `m` to the destination its envelope names.
inline void deliver(const directory& d, net::message m) {
  const net::address to = net::read_header(m).destination;
  send_to(d, to, std::move(m));
}

} // namespace troupe::actors
