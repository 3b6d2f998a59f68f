// A deterministic actor system for the actor tests: CAF's test coordinator
// (scheduler policy "testing") runs one actor's message at a time on the
// test's thread, and its clock moves only when the test says so, so that a
// delayed_send (a retry, a join timeout, a device's hold) fires when the test
// advances time, never by sleeping. A recorder actor stands in for the roles
// a test does not run and keeps what they were sent.
#pragma once

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "actors/directory.hpp"
#include "net/message.hpp"

namespace troupe::testing {

/// What a recorder actor was sent.
struct recorded {
  std::vector<net::message> messages;  ///< every net::message, in order
  std::vector<caf::error> exits;       ///< exit messages (an actor told to stop)
  std::vector<caf::actor_addr> downs;  ///< down messages of the actors it monitors

  /// The messages whose envelope names `to` as destination.
  std::vector<net::message> to(const net::address& to) const {
    std::vector<net::message> out;
    for (const auto& m : messages)
      if (net::read_header(m).destination == to) out.push_back(m);
    return out;
  }
  /// The messages to `to` of kind `which`.
  std::vector<net::message> to(const net::address& to, wire::Envelope::Which which) const {
    std::vector<net::message> out;
    for (const auto& m : this->to(to))
      if (net::envelope_reader(m).root().which() == which) out.push_back(m);
    return out;
  }
  /// The Control messages to `to` of kind `kind`.
  std::vector<net::message> controls(const net::address& to, wire::Control::Kind kind) const {
    std::vector<net::message> out;
    for (const auto& m : this->to(to, wire::Envelope::CONTROL))
      if (net::envelope_reader(m).root().getControl().getKind() == kind) out.push_back(m);
    return out;
  }
  bool saw_down_of(const caf::actor& a) const {
    for (const auto& d : downs)
      if (d == a.address()) return true;
    return false;
  }
};

/// Asks a recorder to monitor an actor: (watch_atom, actor).
using watch_atom = caf::atom_constant<caf::atom("watch")>;

/// An actor that keeps every net::message, exit and down message it gets in `log`.
inline caf::behavior recorder_actor(caf::event_based_actor* self, std::shared_ptr<recorded> log) {
  self->set_exit_handler([self, log](caf::exit_msg& e) {
    log->exits.push_back(e.reason);
    self->quit(e.reason);
  });
  self->set_down_handler([log](caf::down_msg& d) { log->downs.push_back(d.source); });
  return {
      [log](const net::message& m) { log->messages.push_back(m); },
      [self](watch_atom, const caf::actor& a) { self->monitor(a); },
  };
}

/// The kind and amount of the Control message `m`.
inline std::pair<wire::Control::Kind, uint32_t> control_of(const net::message& m) {
  net::envelope_reader r(m);
  REQUIRE(r.root().which() == wire::Envelope::CONTROL);
  auto c = r.root().getControl();
  return {c.getKind(), c.getAmount()};
}

/// An actor system whose scheduler is CAF's test coordinator.
class caf_testing {
public:
  caf_testing() : sys_(configure(cfg_)), sched(dynamic_cast<caf::scheduler::test_coordinator&>(sys_.scheduler())) {
    // A clock at 0 would read as "no time"; CAF's own fixture starts an hour in.
    sched.clock().current_time += std::chrono::hours(1);
  }
  ~caf_testing() {
    // Every actor still running is told to stop and runs its last messages:
    // the system's destructor waits for them.
    for (const auto& a : spawned_) caf::anon_send_exit(a, caf::exit_reason::kill);
    sched.run();
  }
  caf_testing(const caf_testing&) = delete;
  caf_testing& operator=(const caf_testing&) = delete;

  caf::actor_system& sys() { return sys_; }

  /// Keeps `a` to stop it at the end of the test.
  caf::actor keep(caf::actor a) {
    spawned_.push_back(a);
    return a;
  }
  /// A new recorder writing to `log`.
  caf::actor recorder(std::shared_ptr<recorded> log) { return keep(sys_.spawn(recorder_actor, std::move(log))); }

  /// Runs every message in every mailbox (timeouts not triggered); fails on a
  /// run that never ends (an actor messaging itself forever).
  std::size_t run() {
    constexpr std::size_t cap = 100000;
    const std::size_t n = sched.run(cap);
    REQUIRE(n < cap);
    return n;
  }
  /// Moves the test clock on by `d`, fires the timeouts due, and runs what they started.
  std::size_t advance(caf::timespan d) {
    const std::size_t fired = sched.advance_time(d);
    run();
    return fired;
  }

private:
  static caf::actor_system_config& configure(caf::actor_system_config& cfg) {
    cfg.set("scheduler.policy", caf::atom("testing"));
    cfg.set("logger.verbosity", caf::atom("quiet"));
    cfg.set("logger.file-verbosity", caf::atom("quiet"));
    cfg.set("logger.console-verbosity", caf::atom("quiet"));
    return cfg;
  }

  caf::actor_system_config cfg_;
  caf::actor_system sys_;
  std::vector<caf::actor> spawned_;

public:
  caf::scheduler::test_coordinator& sched;
};

} // namespace troupe::testing
