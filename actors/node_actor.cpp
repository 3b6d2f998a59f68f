// A node's own actor: joining the run (and joining it again when dropped), lost peers, the node's end.

#include <caf/all.hpp>

#include <ostream>
#include <set>
#include <sstream>

#include "actors/messages.hpp"
#include "net/protocol.hpp"
#include "actors/node_actor.hpp"
#include "actors/roles.hpp"

namespace troupe::actors {

// --- link_watch: pure ---

std::string describe_refusal(const std::string& reason) {
  if (reason == "bad_mac") return "wrong secret (handshake HMAC mismatch)";
  if (reason == "refused") return "the other side refused the handshake";
  if (reason == "wrong_job") return "another job (the job files or data differ)";
  if (reason == "wrong_schema") return "another schema version (another troupe build)";
  if (reason == "wrong_node") return "a wrong node index (check the node list)";
  if (reason == "timeout") return "the handshake did not finish in time";
  if (reason == "malformed") return "a malformed handshake";
  return reason;
}

void link_watch::up(uint32_t node) {
  peer& p = peers_[node];
  p.up = true;
  p.lost.clear();
}

void link_watch::down(uint32_t node, const std::string& why) {
  peer& p = peers_[node];
  p.up = false;
  p.lost = why;
}

void link_watch::refused(uint32_t node, const std::string& endpoint, const std::string& reason,
                         const std::string& what) {
  if (node == no_node) anonymous_from_ = endpoint;
  peer& p = node == no_node ? anonymous_ : peers_[node];
  if (!endpoint.empty()) p.endpoint = endpoint;
  ++p.refusals;
  p.reason = reason;
  p.what = what;
}

bool link_watch::is_up(uint32_t node) const {
  auto it = peers_.find(node);
  return it != peers_.end() && it->second.up;
}

std::size_t link_watch::up_count() const {
  std::size_t n = 0;
  for (const auto& [node, p] : peers_) n += node != self_ && p.up ? 1 : 0;
  return n;
}

std::string link_watch::name(uint32_t node) const {
  std::string s = node < names_.size() ? names_[node] : "node " + std::to_string(node);
  auto it = peers_.find(node);
  if (it != peers_.end() && !it->second.endpoint.empty()) s += " (" + it->second.endpoint + ")";
  return s;
}

std::string link_watch::why_missing(uint32_t node) const {
  auto it = peers_.find(node);
  if (it == peers_.end()) return "no connection came (is it started, with the same job file, and reachable?)";
  const peer& p = it->second;
  std::string s;
  if (p.refusals > 0) {
    const std::string who = node < names_.size() ? names_[node] : std::to_string(node);
    s = "connections of (or claiming to be) node " + who + " were refused (" + std::to_string(p.refusals) +
        (p.refusals == 1 ? " time" : " times") + "): " + describe_refusal(p.reason) + ": " + p.what;
  }
  if (!p.lost.empty()) s += (s.empty() ? "" : "; ") + std::string("its link was lost: ") + p.lost;
  if (s.empty()) s = p.up ? "its link is up, but it did not join (it waits for links to other nodes)"
                          : "no connection came (is it started, with the same job file, and reachable?)";
  return s;
}

std::string link_watch::describe(const std::vector<uint32_t>& nodes) const {
  std::string s;
  for (uint32_t n : nodes) s += (s.empty() ? "" : "; ") + name(n) + ": " + why_missing(n);
  if (anonymous_.refusals > 0)
    s += (s.empty() ? "" : "; ") + std::string("refused before they named a node: ") +
         std::to_string(anonymous_.refusals) + " connection(s), the last from " + anonymous_from_ + ": " +
         describe_refusal(anonymous_.reason) + ": " + anonymous_.what;
  return s;
}

std::vector<uint32_t> to_blame(const std::vector<uint32_t>& missing, const std::vector<bool>& linked) {
  std::vector<uint32_t> out;
  for (uint32_t n : missing)
    if (n >= linked.size() || !linked[n]) out.push_back(n);
  return out.empty() ? missing : out;
}

namespace {

using join_timeout_atom = caf::atom_constant<caf::atom("jointime")>;
using join_again_atom = caf::atom_constant<caf::atom("joinagain")>;

/// A join not acknowledged in this time (lost on the way) is sent again.
constexpr std::chrono::seconds join_again{2};
/// A node whose link to the coordinator's node is up when its join timeout
/// ends waits this much longer for the coordinator's verdict (which names
/// the node really missing) before it gives up itself.
constexpr std::chrono::seconds verdict_wait{10};

struct node_state {
  node_setup s;
  std::shared_ptr<const directory> dir;
  std::unique_ptr<link_watch> links;
  bool joined = false;        // a join was sent (and is sent again until answered)
  bool acknowledged = false;  // the coordinator answered the join: this node is in the run
  bool member = false;        // it was in the run once: a loss of the coordinator's node is a rejoin
  bool again_pending = false; // a join_again is on its way
  bool deferred = false;      // the first join's timeout waits for the coordinator's verdict
  bool started = false;       // registered in the directory: it may send
  uint64_t attempt = 1;       // the join (1) or rejoin (2, ...) the timeout is for
  std::string dropped;        // why this node joins again
  std::size_t live = 0;   // the node's role actors still running
};
using node_t = caf::stateful_actor<node_state>;

net::address me(node_t* self) { return {self->state.s.self, net::role::node, 0}; }

std::string name_of(node_t* self, uint32_t node) {
  const auto& names = self->state.s.node_names;
  return node < names.size() ? names[node] : "node " + std::to_string(node);
}

bool on_coordinator_node(node_t* self) { return self->state.s.self == self->state.s.coordinator.node; }

std::string seconds(double s) {
  std::ostringstream t;
  t << s;
  return t.str();
}

void tell_coordinator(node_t* self, wire::Control::Kind kind, uint32_t amount = 0, const std::string& detail = {}) {
  auto& st = self->state;
  send_to(*st.dir, st.s.coordinator, make_control(me(self), st.s.coordinator, kind, amount, detail));
}

/// On the coordinator's node: a CAF message to the coordinator itself (what its join timeout reports).
template <class... Ts>
void tell_local_coordinator(node_t* self, Ts&&... xs) {
  auto& st = self->state;
  if (!on_coordinator_node(self)) return;
  if (const caf::actor* c = st.dir->local(st.s.coordinator)) caf::anon_send(*c, std::forward<Ts>(xs)...);
}

/// This node cannot go on: its error is the run's result here; its actors stop.
void fail(node_t* self, const std::string& why, failure kind) {
  auto& st = self->state;
  if (st.s.result && st.s.result->error.empty()) {
    st.s.result->error = why;
    st.s.result->kind = kind;
  }
  for (const auto& a : st.s.locals) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  self->quit();
}

void maybe_join(node_t* self) {
  auto& st = self->state;
  if (!st.started || st.joined) return;
  // The first join needs every link; joining again, the coordinator's (the others come back by themselves).
  if (st.member ? !st.links->is_up(st.s.coordinator.node)
                : st.links->up_count() + 1 < st.s.node_names.size())
    return;
  st.joined = true;
  if (st.s.log && st.s.node_names.size() > 1)
    *st.s.log << "node " << name_of(self, st.s.self)
              << (st.member ? ": the coordinator's node answers again; joining the run again"
                            : ": every link is up; joined the run")
              << std::endl;
  tell_coordinator(self, wire::Control::Kind::JOIN);
  if (!st.again_pending) {
    st.again_pending = true;
    self->delayed_send(self, join_again, join_again_atom::value);
  }
}

/// This node was in the run and is out of it now (its link to the
/// coordinator's node ended, or the coordinator dropped its workers): it
/// joins again once the coordinator's node answers, within the join timeout.
/// Its actors keep their state; the coordinator starts them again.
void rejoin(node_t* self, const std::string& why) {
  auto& st = self->state;
  st.acknowledged = false;
  st.joined = false;
  st.dropped = why;
  ++st.attempt;
  if (st.s.log)
    *st.s.log << "node " << name_of(self, st.s.self) << ": " << why << "; joining the run again when node "
              << name_of(self, st.s.coordinator.node) << " answers (for up to " << seconds(st.s.join_timeout_s)
              << " s)" << std::endl;
  self->delayed_send(self, std::chrono::milliseconds(static_cast<int64_t>(st.s.join_timeout_s * 1000)),
                     join_timeout_atom::value, st.attempt);
  maybe_join(self);
}

void on_peer_down(node_t* self, uint32_t node, const std::string& why, bool goodbye) {
  auto& st = self->state;
  st.links->down(node, why);
  if (node == st.s.coordinator.node && goodbye) {
    // The coordinator's node ended the run (its stops to this node's actors may not all have come).
    for (const auto& a : st.s.locals) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    self->quit();
    return;
  }
  if (node == st.s.coordinator.node) {
    if (st.acknowledged)
      rejoin(self, "lost node " + name_of(self, node) + ", which runs the coordinator (" + why + ")");
    else
      st.joined = false;  // not yet (or no longer) in the run: the join goes again once the link is back
    return;
  }
  // The coordinator decides what a lost node means for the run.
  if (on_coordinator_node(self)) tell_coordinator(self, wire::Control::Kind::LOST, node, why);
}

void on_join_timeout(node_t* self, uint64_t attempt) {
  auto& st = self->state;
  if (attempt != st.attempt || st.acknowledged) return;
  const uint32_t c = st.s.coordinator.node;
  const std::string t = seconds(st.s.join_timeout_s);
  if (st.member) {
    fail(self, "node " + name_of(self, st.s.self) + ": " + st.dropped + ", and could not join the run again within " +
                   t + " s (" + (st.links->is_up(c) ? "its link is up, but the coordinator did not answer"
                                                     : st.links->describe({c})) +
                   "): this node stops; run the same command on every node to resume from the last checkpoint",
         failure::lost_node);
    return;
  }
  // The coordinator's node names the nodes that did not join (its coordinator's timeout).
  if (on_coordinator_node(self)) return;
  std::vector<uint32_t> missing;
  for (uint32_t n = 0; n < st.s.node_names.size(); ++n)
    if (n != st.s.self && !st.links->is_up(n)) missing.push_back(n);
  if (st.links->is_up(c) && !st.deferred) {
    // The coordinator's verdict (its stop) names the node really missing: wait for it a little.
    st.deferred = true;
    self->delayed_send(self, verdict_wait, join_timeout_atom::value, attempt);
    return;
  }
  std::string names;
  for (uint32_t n : missing) names += (names.empty() ? "" : ", ") + name_of(self, n);
  fail(self, "node " + name_of(self, st.s.self) + ": " +
                 (missing.empty() ? "the coordinator did not answer the join within " + t + " s"
                                  : "no link to node(s) " + names + " within " + t + " s: " + st.links->describe(missing)),
       failure::timeout);
}

/// A message from the coordinator: its answer to a join (a Control start),
/// or that it dropped this node's workers (a Control lost naming this node).
void on_message(node_t* self, const net::message& m) {
  auto& st = self->state;
  try {
    net::envelope_reader r(m);
    if (!net::accepts(wire::Role::NODE, r.root().which())) return;  // net/protocol.cpp: Control only
    auto c = r.root().getControl();
    if (c.getKind() == wire::Control::Kind::START) {
      if (st.acknowledged) return;
      st.acknowledged = true;
      if (st.member && st.s.log) *st.s.log << "node " << name_of(self, st.s.self) << ": joined the run again" << std::endl;
      st.member = true;
    } else if (c.getKind() == wire::Control::Kind::LOST && c.getAmount() == st.s.self && st.acknowledged) {
      rejoin(self, "the coordinator dropped this node (" + std::string(c.getDetail().cStr()) + ")");
    }
  } catch (const net::message_error&) {
  }
}

caf::behavior node_actor(node_t* self, node_setup setup, std::shared_ptr<const directory> dir) {
  auto& st = self->state;
  st.s = std::move(setup);
  st.dir = std::move(dir);
  st.links = std::make_unique<link_watch>(st.s.node_names, st.s.self);
  for (const auto& a : st.s.locals) self->monitor(a);
  st.live = st.s.locals.size();
  self->set_down_handler([self](caf::down_msg&) {
    auto& st = self->state;
    // The coordinator's node ends with its coordinator; another node when all
    // of its role actors have stopped (the coordinator stopped them).
    if (st.live > 0 && --st.live == 0 && !on_coordinator_node(self)) {
      tell_coordinator(self, wire::Control::Kind::STOPPED);
      self->quit();
    }
  });
  self->delayed_send(self, std::chrono::milliseconds(static_cast<int64_t>(st.s.join_timeout_s * 1000)),
                     join_timeout_atom::value, st.attempt);
  return {
      [self](node_start_atom) {
        self->state.started = true;
        maybe_join(self);  // a cluster of one node joins at once
      },
      [self](peer_up_atom, uint32_t node) {
        auto& st = self->state;
        st.links->up(node);
        if (!st.member && st.s.log)  // joining: which links are up so far
          *st.s.log << "node " << name_of(self, st.s.self) << ": linked with node " << name_of(self, node) << " ("
                    << st.links->up_count() << " of " << st.s.node_names.size() - 1 << ")" << std::endl;
        tell_local_coordinator(self, peer_up_atom::value, node);
        maybe_join(self);
      },
      [self](peer_down_atom, uint32_t node, const std::string& why, bool goodbye) {
        on_peer_down(self, node, why, goodbye);
      },
      [self](peer_refused_atom, uint32_t node, const std::string& endpoint, const std::string& reason,
             const std::string& what) {
        self->state.links->refused(node, endpoint, reason, what);
        tell_local_coordinator(self, peer_refused_atom::value, node, endpoint, reason, what);
      },
      [self](join_again_atom) {
        auto& st = self->state;
        st.again_pending = false;
        if (st.acknowledged || !st.joined) return;
        tell_coordinator(self, wire::Control::Kind::JOIN);
        st.again_pending = true;
        self->delayed_send(self, join_again, join_again_atom::value);
      },
      [self](join_timeout_atom, uint64_t attempt) { on_join_timeout(self, attempt); },
      [self](const net::message& m) { on_message(self, m); },
  };
}

} // namespace

caf::actor spawn_node_actor(caf::actor_system& sys, node_setup setup, std::shared_ptr<const directory> dir) {
  return sys.spawn(node_actor, std::move(setup), std::move(dir));
}

} // namespace troupe::actors
