#pragma once

// What a node knows of its links while it joins the run (or joins it again
// after being dropped): pure, so that the join timeouts' messages are tested
// without actors. The node's actor (actors/node_actor.cpp) and the
// coordinator keep one each.

#include <caf/atom.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace troupe::actors {

/// The transport refused a connection of, or claiming to be, a node:
/// (peer_refused_atom, node, its configured "host:port", reason, sentence).
/// A refusal of a connection that named no node has node `no_node` and its remote address.
using peer_refused_atom = caf::atom_constant<caf::atom("peerrefuse")>;
constexpr uint32_t no_node = ~uint32_t(0);

/// A transport's short rejection reason ("bad_mac", "wrong_job", ...) as
/// words an operator acts on; an unknown reason as it is.
std::string describe_refusal(const std::string& reason);

/// The state of this node's links to the others, and why one is missing.
class link_watch {
public:
  link_watch(std::vector<std::string> names, uint32_t self) : names_(std::move(names)), self_(self) {}

  void up(uint32_t node);
  void down(uint32_t node, const std::string& why);
  /// A refused connection of (or claiming to be) `node`, configured at `endpoint`; `no_node`: a
  /// connection from `endpoint` refused before it named a node.
  void refused(uint32_t node, const std::string& endpoint, const std::string& reason, const std::string& what);

  bool is_up(uint32_t node) const;
  /// Links up now, this node not counted.
  std::size_t up_count() const;
  /// "c (127.0.0.1:7003)": the node's name and, once known, its address.
  std::string name(uint32_t node) const;
  /// Why there is no link to `node` (or none came): its refusals, its loss, or that nothing came.
  std::string why_missing(uint32_t node) const;
  /// "a (...): why; b: why" for every node of `nodes`, then the refusals that named no node.
  std::string describe(const std::vector<uint32_t>& nodes) const;

private:
  struct peer {
    bool up = false;
    std::string endpoint, lost;
    uint64_t refusals = 0;
    std::string reason, what;  // the last refusal
  };
  std::vector<std::string> names_;
  uint32_t self_;
  std::map<uint32_t, peer> peers_;
  peer anonymous_;  // refusals of connections that named no node
  std::string anonymous_from_;
};

/// The nodes a join timeout blames: of those that did not join (`missing`),
/// the ones with no link to the coordinator's node (`linked` says which
/// have one); when every one has a link, all of `missing` (they wait for
/// links among themselves).
std::vector<uint32_t> to_blame(const std::vector<uint32_t>& missing, const std::vector<bool>& linked);

} // namespace troupe::actors
