// One node of a run, one process being a cluster of one: the actor system,
// the roles from the table, the links to the other nodes (a cluster only),
// and the wait for the run's end.

#include "actors/node_run.hpp"

#include <caf/all.hpp>

#include <iomanip>
#include <optional>
#include <ostream>
#include <sstream>

#include "actors/node_actor.hpp"
#include "actors/spawn_roles.hpp"
#include "net/auth.hpp"
#include "train/cluster.hpp"
#include "train/trace.hpp"

namespace troupe::actors {

namespace {

void configure(caf::actor_system_config& cfg, const train::plan& p, uint32_t self) {
  cfg.set("scheduler.max-threads", static_cast<size_t>(p.nodes[self].scheduler_threads));
  cfg.set("logger.verbosity", caf::atom("quiet"));
  // Several workers need one shared FIFO run queue: work stealing resumes the
  // actor woken last first, which starved workers completely (0 samples for one
  // of 16 CNN workers). A single worker keeps work stealing: twice the throughput.
  // Pipeline stages share it too: with work stealing, an activation sent by a
  // busy stage sat in that stage's thread's queue until an idle thread stole
  // it, milliseconds later (a longer pipeline bubble).
  if (p.nodes[self].workers > 1 || p.nodes[self].stages > 1) cfg.set("scheduler.policy", caf::atom("sharing"));
}

/// Waits until `last` (the coordinator, or the node's actor) has stopped,
/// then stops every local actor; the actor system waits for them when it goes.
void wait_for(caf::actor_system& sys, const caf::actor& last, const directory& dir) {
  caf::scoped_actor self{sys};
  self->monitor(last);
  self->receive([](const caf::down_msg&) {});
  for (const auto& [a, h] : dir.locals()) caf::anon_send_exit(h, caf::exit_reason::user_shutdown);
}

/// Where the transport's events go: messages to the local actor they name,
/// peers up, down and refused to the node's actor (`*node_actor`, set once it
/// exists), rejections to the log through `rejections`.
net::transport_handlers link_handlers(std::shared_ptr<directory> dir, std::shared_ptr<caf::actor> node_actor,
                                      std::shared_ptr<net::rejection_log> rejections,
                                      std::vector<net::endpoint> nodes, std::ostream& log) {
  net::transport_handlers h;
  h.on_message = [dir](uint32_t, const net::address& to, net::message m) {
    if (const caf::actor* a = dir->local(to)) caf::anon_send(*a, std::move(m));
  };
  h.on_peer_up = [node_actor](uint32_t node) { caf::anon_send(*node_actor, peer_up_atom::value, node); };
  h.on_peer_down = [node_actor](uint32_t node, const std::string& why, bool goodbye) {
    caf::anon_send(*node_actor, peer_down_atom::value, node, why, goodbye);
  };
  h.on_rejected = [&log, rejections, node_actor, nodes = std::move(nodes)](const net::rejection& x) {
    for (const std::string& line : rejections->add(x, net::rejection_log::clock::now())) log << line << std::endl;
    // A refused handshake, with the node dialed or claimed (unauthenticated), or its remote address
    // where it named none: the join timeout says it.
    if (x.authenticated) return;
    if (x.node >= 0 && static_cast<std::size_t>(x.node) < nodes.size())
      caf::anon_send(*node_actor, peer_refused_atom::value, static_cast<uint32_t>(x.node),
                     nodes[x.node].host + ":" + std::to_string(nodes[x.node].port), x.reason, x.what);
    else
      caf::anon_send(*node_actor, peer_refused_atom::value, no_node, x.remote, x.reason, x.what);
  };
  return h;
}

/// A cluster node's links: messages to other nodes' addresses go through them.
std::unique_ptr<net::transport> open_links(const net::transport_options& to, node_context& c,
                                           std::shared_ptr<caf::actor> node_actor) {
  c.rejections = std::make_shared<net::rejection_log>();
  auto link = std::make_unique<net::transport>(to, link_handlers(c.dir, node_actor, c.rejections, to.nodes, *c.log));
  for (uint32_t n = 0; n < to.nodes.size(); ++n)
    if (n != c.self)
      c.dir->add_remote(n, [l = link.get(), n](const net::address& a, const net::message& m, int priority) {
        l->send(n, a, m, priority);
      });
  return link;
}

/// The node's context: names, timeouts, the timeline (node 0 writes --trace, node n --trace with ".node<n>").
node_context context_of(const job& j, const train::cluster_spec& c, uint32_t self, train::starting_point& start,
                        std::ostream& log) {
  const settings& s = j.config();
  node_context ctx;
  ctx.job = std::make_shared<const job>(j);
  ctx.start = &start;
  ctx.self = self;
  for (const auto& n : c.nodes) ctx.node_names.push_back(n.name);
  if (ctx.node_names.empty()) ctx.node_names.push_back("local");
  ctx.join_timeout_s = c.join_timeout_s;
  const train::topology topo = train::topology_of(c, self, s.threads);
  ctx.info = train::info_of(j, topo.nodes[self].threads);
  ctx.dir = std::make_shared<directory>();
  if (!s.trace.empty())
    ctx.trace = std::make_shared<train::tracer>(self == 0 ? s.trace : s.trace + ".node" + std::to_string(self), self);
  ctx.log = &log;
  if (start.p.shared_buffer) {
    const model::model::flat_buffers flat = start.net.flatten();
    ctx.hogwild = std::make_shared<hogwild_store>(flat.values.data(), flat.values.numel());
  }
  return ctx;
}

/// What crossed this node's links, for the log (and a cost model's check).
void log_traffic(const std::string& node, const net::transport_stats& s, std::ostream& log) {
  const auto mib = [](uint64_t b) { return static_cast<double>(b) / (1 << 20); };
  std::ostringstream line;  // the log's own format stays as it is
  line << "node " << node << ": sent " << std::fixed << std::setprecision(1) << mib(s.bytes_sent + s.lane_bytes_sent)
       << " MiB in " << s.frames_sent << " frames, received " << mib(s.bytes_received + s.lane_bytes_received)
       << " MiB in " << s.frames_received << " frames";
  if (s.lane_frames_sent + s.lane_frames_received > 0)
    line << "; through same-host lanes: sent " << mib(s.lane_bytes_sent) << " MiB in " << s.lane_frames_sent
         << " frames, received " << mib(s.lane_bytes_received) << " MiB in " << s.lane_frames_received << " frames";
  line << "\n";
  log << line.str();
}

} // namespace

history run_node(const job& j, const train::cluster_spec& c, uint32_t self, std::ostream& log) {
  const bool linked = !c.single_process();
  std::string secret;
  if (linked) {
    const train::node_entry& me = c.nodes.at(self);
    log << "node " << me.name << " (" << self + 1 << " of " << c.nodes.size() << "), listening on " << me.host << ":"
        << me.port << "\n";
    secret = net::read_secret_file(c.secret_file);  // before minutes of loading
  }
  train::starting_point start = train::start_of(j, c, self, log);
  if (start.finished()) return {};
  if (self == start.p.coordinator.node) train::log_plan(j, start.p, start.net.layout(), log);
  log << train::host_threads_note(c, self, j.config().threads);
  std::optional<net::transport_options> to;
  if (linked) to = train::link_options(c, self, secret, train::job_identity(j, c, start), train::environment());
  auto result = std::make_shared<outcome>();
  {
    caf::actor_system_config cfg;
    configure(cfg, start.p, self);
    caf::actor_system sys{cfg};
    // Inside the actor system's scope: a detached actor's thread ends when the
    // last handle to it goes, and the system's end waits for those threads.
    node_context ctx = context_of(j, c, self, start, log);
    ctx.result = result;
    // The transport's events go to the node's actor, which exists once spawn_roles returns.
    auto node_actor = std::make_shared<caf::actor>();
    std::unique_ptr<net::transport> link = to ? open_links(*to, ctx, node_actor) : nullptr;
    const caf::actor last = spawn_roles(sys, ctx);
    *node_actor = *ctx.dir->local({self, net::role::node, 0});
    if (link) link->start();
    wait_for(sys, last, *ctx.dir);
    if (link) {
      link->stop();
      log_traffic(c.nodes.at(self).name, link->stats(), log);
    }
    if (ctx.rejections)
      for (const std::string& line : ctx.rejections->flush()) log << line << "\n";
    if (ctx.trace) ctx.trace->write();
  }  // the actor system waits for every actor here
  if (!result->error.empty()) throw_failure(result->kind, result->error);
  return result->epochs;
}

} // namespace troupe::actors
