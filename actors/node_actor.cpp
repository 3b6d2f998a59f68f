// A node's own actor: joining the run, lost peers, the node's end.

#include <caf/all.hpp>

#include <ostream>
#include <set>
#include <sstream>

#include "actors/messages.hpp"
#include "actors/roles.hpp"

namespace troupe::actors {

namespace {

using join_timeout_atom = caf::atom_constant<caf::atom("jointime")>;
using join_again_atom = caf::atom_constant<caf::atom("joinagain")>;

/// A join not acknowledged in this time (lost on the way) is sent again.
constexpr std::chrono::seconds join_again{2};

struct node_state {
  node_setup s;
  std::shared_ptr<const directory> dir;
  std::set<uint32_t> up;  // nodes whose links are up
  bool joined = false;
  bool acknowledged = false;  // the coordinator answered the join
  bool started = false;       // registered in the directory: it may send
  std::size_t live = 0;   // the node's role actors still running
};
using node_t = caf::stateful_actor<node_state>;

net::address me(node_t* self) { return {self->state.s.self, net::role::node, 0}; }

std::string name_of(node_t* self, uint32_t node) {
  const auto& names = self->state.s.node_names;
  return node < names.size() ? names[node] : "node " + std::to_string(node);
}

void tell_coordinator(node_t* self, wire::Control::Kind kind, uint32_t amount = 0, const std::string& detail = {}) {
  auto& st = self->state;
  send_to(*st.dir, st.s.coordinator, make_control(me(self), st.s.coordinator, kind, amount, detail));
}

/// This node cannot go on: its error is the run's result here; its actors stop.
void fail(node_t* self, const std::string& why) {
  auto& st = self->state;
  if (st.s.result && st.s.result->error.empty()) st.s.result->error = why;
  for (const auto& a : st.s.locals) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  self->quit();
}

void maybe_join(node_t* self) {
  auto& st = self->state;
  if (!st.started || st.joined || st.up.size() + 1 < st.s.node_names.size()) return;
  st.joined = true;
  if (st.s.log && st.s.node_names.size() > 1) *st.s.log << "node " << name_of(self, st.s.self) << ": every link is up; joined the run" << std::endl;
  tell_coordinator(self, wire::Control::Kind::JOIN);
  self->delayed_send(self, join_again, join_again_atom::value);
}

caf::behavior node_actor(node_t* self, node_setup setup, std::shared_ptr<const directory> dir) {
  auto& st = self->state;
  st.s = std::move(setup);
  st.dir = std::move(dir);
  for (const auto& a : st.s.locals) self->monitor(a);
  st.live = st.s.locals.size();
  self->set_down_handler([self](caf::down_msg&) {
    auto& st = self->state;
    // The coordinator's node ends with its coordinator; another node when all
    // of its role actors have stopped (the coordinator stopped them).
    if (st.live > 0 && --st.live == 0 && st.s.self != st.s.coordinator.node) {
      tell_coordinator(self, wire::Control::Kind::STOPPED);
      self->quit();
    }
  });
  self->delayed_send(self, std::chrono::milliseconds(static_cast<int64_t>(st.s.join_timeout_s * 1000)),
                     join_timeout_atom::value);
  return {
      [self](node_start_atom) {
        self->state.started = true;
        maybe_join(self);  // a cluster of one node joins at once
      },
      [self](peer_up_atom, uint32_t node) {
        self->state.up.insert(node);
        maybe_join(self);
      },
      [self](peer_down_atom, uint32_t node, const std::string& why, bool goodbye) {
        auto& st = self->state;
        st.up.erase(node);
        if (node == st.s.coordinator.node && goodbye) {
          // The coordinator's node ended the run (its stops to this node's actors may not all have come).
          for (const auto& a : st.s.locals) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
          self->quit();
          return;
        }
        if (node == st.s.coordinator.node) {
          fail(self, "lost node " + name_of(self, node) + ", which runs the coordinator (" + why +
                         "): this node stops; run the same command on every node to resume from the last checkpoint");
          return;
        }
        // The coordinator decides what a lost node means for the run.
        if (st.s.self == st.s.coordinator.node) tell_coordinator(self, wire::Control::Kind::LOST, node, why);
      },
      [self](join_again_atom) {
        auto& st = self->state;
        if (st.acknowledged) return;
        tell_coordinator(self, wire::Control::Kind::JOIN);
        self->delayed_send(self, join_again, join_again_atom::value);
      },
      [self](join_timeout_atom) {
        auto& st = self->state;
        if (st.joined) return;
        std::string missing;
        for (uint32_t n = 0; n < st.s.node_names.size(); ++n)
          if (n != st.s.self && !st.up.count(n)) missing += (missing.empty() ? "" : ", ") + name_of(self, n);
        std::ostringstream t;
        t << st.s.join_timeout_s;
        fail(self, "node " + name_of(self, st.s.self) + ": no link to node(s) " + missing + " within " + t.str() +
                       " s (are they started, with the same job file and secret, and reachable?)");
      },
      [self](const net::message& m) {
        // The coordinator acknowledges a join with a Control start.
        try {
          net::envelope_reader r(m);
          if (r.root().which() == wire::Envelope::CONTROL &&
              r.root().getControl().getKind() == wire::Control::Kind::START)
            self->state.acknowledged = true;
        } catch (const net::message_error&) {
        }
      },
  };
}

} // namespace

caf::actor spawn_node_actor(caf::actor_system& sys, node_setup setup, std::shared_ptr<const directory> dir) {
  return sys.spawn(node_actor, std::move(setup), std::move(dir));
}

} // namespace troupe::actors
