#include "net/transport.hpp"

#include "net/session.hpp"
#include "net/shm_lane.hpp"

#include <boost/asio.hpp>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <limits>
#include <list>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

namespace troupe::net {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using steady = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

constexpr uint32_t dialer_kinds = kind_bit(frame_kind::challenge) | kind_bit(frame_kind::refuse);
constexpr uint32_t hello_kinds = kind_bit(frame_kind::hello);
constexpr uint32_t proof_kinds = kind_bit(frame_kind::proof) | kind_bit(frame_kind::refuse);
constexpr uint32_t session_kinds = kind_bit(frame_kind::message) | kind_bit(frame_kind::heartbeat) |
                                   kind_bit(frame_kind::goodbye) | kind_bit(frame_kind::message_ref) |
                                   kind_bit(frame_kind::lane_offer) | kind_bit(frame_kind::lane_accept);
constexpr std::size_t max_batch_frames = 64;    // frames per gather write
constexpr std::size_t max_batch_bytes = 256 << 10;  // bytes per gather write (a frame past it waits):
                                                    // a frame sent later with a higher priority overtakes the rest
constexpr milliseconds first_backoff{20}, max_backoff{1000};
// send() writes a frame itself only on a link idle this long: a request after a
// reply qualifies; the next frame of a burst is left to the io thread, which
// gathers many into one write.
constexpr std::chrono::microseconds direct_write_idle{5};

std::string printable(const std::vector<std::byte>& body) {
  std::string s;
  for (std::byte b : body) {
    const char c = static_cast<char>(b);
    s += (c >= 32 && c < 127) ? c : '?';
  }
  return s;
}

std::string millis(milliseconds d) { return std::to_string(d.count()) + " ms"; }

// As much as the socket takes per write (Asio's transfer_all stops each at 64 KiB).
std::size_t whole_buffers(const boost::system::error_code& ec, std::size_t) {
  return ec ? 0 : std::numeric_limits<std::size_t>::max();
}

} // namespace

uint64_t transport_stats::rejected() const {
  uint64_t n = 0;
  for (auto v : rejected_frames) n += v;
  for (auto v : rejected_handshakes) n += v;
  return n + refused_connections;
}

struct transport::impl {
  // A frame waiting to be written, with the faults decided for it.
  using queued = session_frame;

  // One TCP connection: dialing, in its handshake, established, or closed.
  struct link {
    enum class phase { connecting, handshake, refusing, established, closed };
    link(asio::io_context& io, uint64_t max_frame, std::shared_ptr<buffer_pool> pool)
        : sock(io), deadline(io), delay_timer(io), reader(max_frame, std::move(pool)) {}

    tcp::socket sock;
    asio::steady_timer deadline;     // of the dial and the handshake
    asio::steady_timer delay_timer;  // fault injection
    frame_reader reader;
    phase ph = phase::connecting;
    bool dialer = false;
    int64_t peer = -1;  // the node dialed, or the node a hello claims
    std::string remote;
    asio::ip::address remote_ip;
    bool local = false;  // the peer is on this host, in this network namespace (same_host)
    std::unique_ptr<frame_cipher> sealer;  // once established: protects the frames this side writes
    std::deque<out_frame> copies;          // fault injection: duplicates being written, each sealed alone
    steady::time_point frame_began{};      // when the frame now arriving began (epoch: none)
    std::unique_ptr<dialer_handshake> dialer_hs;
    std::unique_ptr<acceptor_handshake> acceptor_hs;
    session_info sent;                 // what this side said in the handshake
    std::deque<queued> control;        // handshake, heartbeat, refuse frames
    std::vector<queued> in_flight;     // being written
    std::vector<asio::const_buffer> buffers;
    std::atomic<bool> writing{false};  // once established: changed under the peer's mutex
    bool disconnect_after = false;     // fault injection: close once this write completes
    std::atomic<steady::rep> last_tx{steady::now().time_since_epoch().count()};
  };
  using link_ptr = std::shared_ptr<link>;

  // What this node knows of another: its session (the frames for it) and its links.
  struct peer {
    peer(asio::io_context& io, session_counters& c, uint64_t max_queue_bytes)
        : s(c, max_queue_bytes), dial_timer(io) {}
    uint32_t node = 0;

    std::mutex m;  // guards s's sending side (net/session.hpp), kick_pending and current, which send() touches
    session s;
    bool kick_pending = false;
    link_ptr current;  // the established link
    // This side's same-host lane to the peer (net/shm_lane.hpp), of this session.
    enum class lane_state { none, creating, offered, up, unavailable } lane = lane_state::none;
    std::shared_ptr<lane_ring> ring;

    // io thread only:
    steady::time_point last_rx;
    asio::steady_timer dial_timer;
    bool dial_scheduled = false, dialing = false;
    milliseconds backoff = first_backoff;
    std::shared_ptr<lane_view> view;  // the peer's lane to this side, mapped
  };

  struct counters {
    std::atomic<uint64_t> frames_sent{0}, bytes_sent{0}, frames_received{0}, bytes_received{0}, heartbeats_sent{0},
        heartbeats_received{0}, send_refused{0}, faults_dropped{0}, faults_delayed{0}, faults_duplicated{0},
        faults_disconnected{0}, links_up{0}, handler_errors{0}, lane_frames_sent{0}, lane_bytes_sent{0},
        lane_frames_received{0}, lane_bytes_received{0}, lanes_up{0}, lane_full{0};
    std::array<std::atomic<uint64_t>, frame_errors> rejected_frames{};
    std::array<std::atomic<uint64_t>, auth_errors> rejected_handshakes{};
    std::atomic<uint64_t> refused_connections{0};
    session_counters sessions;  // resent, duplicates, lost, dropped at down, sessions up
  };

  transport_options opt;
  transport_handlers handlers;
  asio::io_context io{1};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  tcp::acceptor acceptor{io};
  asio::steady_timer tick_timer{io};
  std::vector<std::unique_ptr<peer>> peers;
  std::set<link_ptr> pending;  // accepted, handshake not finished
  std::list<link_ptr> silent;  // pending links that have not sent a valid hello yet, oldest first
  std::vector<asio::ip::address> node_addresses;  // of every node: the only sources accepted (empty: any)
  std::shared_ptr<buffer_pool> pool;
  std::shared_ptr<buffer_pool> send_pool;  // encrypted payloads (encrypt = true)
  auth_identity me;
  uint64_t incarnation = 0;
  std::mt19937_64 rng;
  std::thread thread;
  std::atomic<std::thread::id> io_thread_id{};
  std::atomic<bool> started{false}, stopped{false};
  std::atomic<uint16_t> port{0};
  counters c;

  impl(transport_options o, transport_handlers h) : opt(std::move(o)), handlers(std::move(h)) {
    const std::size_t n = opt.nodes.size();
    if (n == 0) throw error("transport: the node list is empty");
    if (opt.self >= n)
      throw error("transport: this node's index " + std::to_string(opt.self) + " is outside the node list (" +
                  std::to_string(n) + " nodes)");
    if (opt.secret.empty())
      throw error("transport: no shared secret; every node needs the same secret file (read_secret_file)");
    if (opt.heartbeat.count() <= 0 || opt.peer_timeout <= opt.heartbeat || opt.connect_timeout.count() <= 0)
      throw error("transport: heartbeat, peer_timeout and connect_timeout must be positive and peer_timeout longer "
                  "than heartbeat");
    me.secret = opt.secret;
    me.job = job_digest(opt.job_hash);
    me.schema = wire::SCHEMA_VERSION;
    me.node = opt.self;
    incarnation = random_id();
    rng.seed(opt.faults.seed * 0x9e3779b97f4a7c15ull + opt.self);
    pool = buffer_pool::create(opt.pool_bytes);
    send_pool = buffer_pool::create(opt.encrypt ? opt.pool_bytes : 0);
    for (std::size_t i = 0; i < n; ++i) {
      peers.push_back(std::make_unique<peer>(io, c.sessions, opt.max_queue_bytes));
      peers.back()->node = static_cast<uint32_t>(i);
    }
  }

  // ---- helpers ----

  void reject(const link& l, const std::string& reason, const std::string& what) {
    if (!handlers.on_rejected) return;
    rejection r;
    r.remote = l.remote;
    r.node = l.peer;
    r.authenticated = l.ph == link::phase::established;
    r.reason = reason;
    r.what = what;
    handlers.on_rejected(r);
  }

  std::string describe(const link& l) const {
    if (l.ph == link::phase::established || l.dialer)
      return "node " + std::to_string(l.peer) + " (" + l.remote + ")";
    std::string s = "connection from " + l.remote;
    if (l.peer >= 0) s += " claiming node " + std::to_string(l.peer);
    return s;
  }

  link_ptr make_link() { return std::make_shared<link>(io, opt.max_frame_bytes, pool); }

  session_info session_for(const peer& p) const { return p.s.offer(incarnation); }

  bool on_io_thread() const { return io_thread_id.load() == std::this_thread::get_id(); }

  static void no_delay(tcp::socket& s) {
    boost::system::error_code ec;
    s.set_option(tcp::no_delay(true), ec);
  }

  // ---- start and stop ----

  void start() {
    if (started.exchange(true)) throw error("transport::start: already started");
    const endpoint& e = opt.nodes[opt.self];
    const std::string where = e.host + ":" + std::to_string(e.port);
    try {
      tcp::resolver resolver(io);
      auto results = resolver.resolve(e.host, std::to_string(e.port), tcp::resolver::passive);
      const tcp::endpoint ep = *results.begin();
      acceptor.open(ep.protocol());
      acceptor.set_option(tcp::acceptor::reuse_address(true));
      acceptor.bind(ep);
      acceptor.listen();
      port = acceptor.local_endpoint().port();
    } catch (const boost::system::system_error& x) {
      throw error("node " + std::to_string(opt.self) + " cannot listen on " + where + ": " + x.code().message() +
                  " (is another process using the port? is the host this machine's?)");
    }
    resolve_node_addresses();
    work.emplace(asio::make_work_guard(io));
    accept();
    for (uint32_t j = 0; j < opt.self; ++j) schedule_dial(j, milliseconds(0));
    schedule_tick();
    thread = std::thread([this] {
      io_thread_id = std::this_thread::get_id();
      io.run();
    });
  }

  void stop() {
    if (!started) return;
    if (on_io_thread()) throw error("transport::stop: called from a transport callback");
    if (!stopped.exchange(true)) asio::post(io, [this] { shutdown(); });
    if (thread.joinable()) thread.join();
  }

  void shutdown() {
    boost::system::error_code ec;
    acceptor.close(ec);
    tick_timer.cancel();
    for (auto& p : peers) {
      p->dial_timer.cancel();
      link_ptr l;
      {
        std::lock_guard<std::mutex> lock(p->m);
        l = p->current;
        // Best effort, and only between frames: a peer that misses it finds out by timeout.
        if (l && !l->writing) {
          out_frame bye = make_control_frame(frame_kind::goodbye);
          if (l->sealer) bye.seal(*l->sealer);
          std::vector<std::byte> bytes;
          bye.for_each_piece([&](const std::byte* d, std::size_t n) { bytes.insert(bytes.end(), d, d + n); });
          (void)::send(l->sock.native_handle(), bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
        }
      }
      if (!l) continue;
      close_link(l, "stopped");
    }
    for (auto l : std::vector<link_ptr>(pending.begin(), pending.end())) close_link(l, "stopped");
    work.reset();
    io.stop();
  }

  // Where every node's host resolves, only those addresses may connect.
  void resolve_node_addresses() {
    std::vector<asio::ip::address> all;
    tcp::resolver resolver(io);
    for (const endpoint& e : opt.nodes) {
      boost::system::error_code ec;
      auto results = resolver.resolve(e.host, std::to_string(e.port), ec);
      if (ec || results.empty()) return;  // a name that does not resolve here: no filter
      for (const auto& r : results) {
        const auto a = plain(r.endpoint().address());
        if (a.is_unspecified()) return;
        all.push_back(a);
      }
    }
    node_addresses = std::move(all);
  }

  // The link's peer is on this host, in this network namespace: a loopback
  // address, or this socket's own address at the other end.
  static bool same_host(link& l) {
    if (l.remote_ip.is_loopback()) return true;
    boost::system::error_code ec;
    const auto here = l.sock.local_endpoint(ec);
    return !ec && plain(here.address()) == l.remote_ip;
  }

  static asio::ip::address plain(const asio::ip::address& a) {
    if (a.is_v6() && a.to_v6().is_v4_mapped()) return asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
    return a;
  }

  // ---- accepting and dialing ----

  void accept() {
    auto l = make_link();
    acceptor.async_accept(l->sock, [this, l](const boost::system::error_code& ec) {
      if (ec == asio::error::operation_aborted || stopped) return;
      if (!ec) on_accepted(l);
      accept();
    });
  }

  void on_accepted(const link_ptr& l) {
    boost::system::error_code ec;
    auto ep = l->sock.remote_endpoint(ec);
    if (ec) {
      l->sock.close(ec);
      return;
    }
    l->remote_ip = plain(ep.address());
    l->local = same_host(*l);
    l->remote = l->remote_ip.to_string() + ":" + std::to_string(ep.port());
    if (!node_addresses.empty() &&
        std::find(node_addresses.begin(), node_addresses.end(), l->remote_ip) == node_addresses.end()) {
      ++c.refused_connections;
      reject(*l, "unknown_address",
             describe(*l) + ": not the address of any node of the job file's [cluster] nodes; closed");
      l->sock.close(ec);
      return;
    }
    // A flood of connections that say nothing loses its oldest ones, never a node's hello.
    std::size_t from_here = 0;
    for (auto& s : silent) from_here += s->remote_ip == l->remote_ip;
    if (from_here >= opt.max_pending_per_address) evict_silent(&l->remote_ip);
    if (silent.size() >= opt.max_pending) evict_silent(nullptr);
    no_delay(l->sock);
    l->ph = link::phase::handshake;
    l->reader.allow(hello_kinds);
    l->acceptor_hs = std::make_unique<acceptor_handshake>(me, static_cast<uint32_t>(opt.nodes.size()));
    pending.insert(l);
    silent.push_back(l);
    arm_deadline(l);
    read(l);
  }

  // Closes the oldest pending link that has sent no hello yet (from `ip`, when given).
  void evict_silent(const asio::ip::address* ip) {
    for (auto it = silent.begin(); it != silent.end(); ++it) {
      if (ip && (*it)->remote_ip != *ip) continue;
      link_ptr victim = *it;
      ++c.refused_connections;
      reject(*victim, "too_many_pending",
             describe(*victim) + ": closed to make room (too many connections from " +
                 (ip ? victim->remote_ip.to_string() : std::string("anywhere")) + " in their handshake)");
      close_link(victim, "too many pending connections");
      return;
    }
  }

  // A hello named node `j`: at most pending_per_node such links wait for their proof; the oldest goes.
  void claim_slot(const link_ptr& l, uint32_t j) {
    silent.remove(l);
    std::vector<link_ptr> claims;
    for (auto& p : pending)
      if (p != l && p->peer == j && !p->dialer && p->ph == link::phase::handshake) claims.push_back(p);
    if (claims.size() < opt.pending_per_node) return;
    // pending is ordered by pointer, not age: the deadline that expires first is the oldest.
    auto oldest = std::min_element(claims.begin(), claims.end(), [](const link_ptr& a, const link_ptr& b) {
      return a->deadline.expiry() < b->deadline.expiry();
    });
    ++c.refused_connections;
    reject(**oldest, "too_many_pending", describe(**oldest) + ": closed, a newer connection claims the same node");
    close_link(*oldest, "replaced by a newer hello");
  }

  void arm_deadline(const link_ptr& l) {
    l->deadline.expires_after(opt.connect_timeout);
    l->deadline.async_wait([this, l](const boost::system::error_code& ec) {
      if (ec || l->ph == link::phase::established || l->ph == link::phase::closed) return;
      if (l->ph == link::phase::handshake) {
        ++c.rejected_handshakes[static_cast<int>(auth_error::timeout)];
        reject(*l, to_string(auth_error::timeout),
               describe(*l) + ": the handshake did not finish in " + millis(opt.connect_timeout) + "; closed");
      }
      close_link(l, "timed out");
    });
  }

  void schedule_dial(uint32_t j, milliseconds delay) {
    peer& p = *peers[j];
    if (stopped || p.dial_scheduled || p.dialing) return;
    p.dial_scheduled = true;
    p.dial_timer.expires_after(delay);
    p.dial_timer.async_wait([this, j](const boost::system::error_code& ec) {
      peer& p = *peers[j];
      p.dial_scheduled = false;
      if (!ec && !stopped) dial(j);
    });
  }

  void dial(uint32_t j) {
    peer& p = *peers[j];
    {
      std::lock_guard<std::mutex> lock(p.m);
      if (p.dialing || p.current) return;
    }
    p.dialing = true;
    auto l = make_link();
    l->dialer = true;
    l->peer = j;
    const endpoint& e = opt.nodes[j];
    l->remote = e.host + ":" + std::to_string(e.port);
    arm_deadline(l);
    auto resolver = std::make_shared<tcp::resolver>(io);
    resolver->async_resolve(
        e.host, std::to_string(e.port),
        [this, l, resolver](const boost::system::error_code& ec, tcp::resolver::results_type results) {
          if (l->ph == link::phase::closed) return;
          if (ec) {
            close_link(l, "cannot resolve " + l->remote + ": " + ec.message());
            return;
          }
          asio::async_connect(l->sock, results, [this, l](const boost::system::error_code& ec, const tcp::endpoint&) {
            if (l->ph == link::phase::closed) return;
            if (ec) {
              close_link(l, "cannot connect: " + ec.message());
              return;
            }
            on_connected(l);
          });
        });
  }

  void on_connected(const link_ptr& l) {
    no_delay(l->sock);
    boost::system::error_code ec;
    const auto ep = l->sock.remote_endpoint(ec);
    if (!ec) {
      l->remote_ip = plain(ep.address());
      l->local = same_host(*l);
    }
    peer& p = *peers[l->peer];
    l->ph = link::phase::handshake;
    l->sent = session_for(p);
    l->dialer_hs = std::make_unique<dialer_handshake>(me, static_cast<uint32_t>(l->peer), l->sent);
    l->reader.allow(dialer_kinds);
    const auto& hello = l->dialer_hs->hello();
    l->control.push_back({make_control_frame(frame_kind::hello, hello.data(), hello.size())});
    pump(l);
    read(l);
  }

  // ---- the handshake ----

  void on_handshake_frame(const link_ptr& l, const in_frame& f) {
    try {
      if (f.header.kind == frame_kind::refuse)
        throw auth_failure(auth_error::refused, describe(*l) + " refused this node: " + printable(f.body));
      if (l->dialer) {
        std::vector<std::byte> proof = l->dialer_hs->on_challenge(f.body);
        l->control.push_back({make_control_frame(frame_kind::proof, proof.data(), proof.size())});
        establish(l, l->dialer_hs->peer_session());
      } else if (f.header.kind == frame_kind::hello) {
        l->acceptor_hs->on_hello(f.body);
        l->peer = l->acceptor_hs->claimed_node();
        claim_slot(l, static_cast<uint32_t>(l->peer));
        l->sent = session_for(*peers[l->peer]);
        std::vector<std::byte> challenge = l->acceptor_hs->challenge(l->sent);
        l->control.push_back({make_control_frame(frame_kind::challenge, challenge.data(), challenge.size())});
        l->reader.allow(proof_kinds);
        pump(l);
      } else {
        l->acceptor_hs->on_proof(f.body);
        establish(l, l->acceptor_hs->peer_session());
      }
    } catch (const auth_failure& e) {
      // A hello of another job or schema still named a node: the refusal says which (unauthenticated).
      if (!l->dialer && l->peer < 0 && l->acceptor_hs) {
        const int64_t named = l->acceptor_hs->named_node();
        if (named > static_cast<int64_t>(opt.self) && named < static_cast<int64_t>(opt.nodes.size())) l->peer = named;
      }
      ++c.rejected_handshakes[static_cast<int>(e.reason())];
      const std::string what = describe(*l) + ": " + e.what();
      reject(*l, to_string(e.reason()), what + "; closed");
      if (e.reason() == auth_error::refused) {
        close_link(l, "refused");
        return;
      }
      // Tell the peer why, then close (the deadline bounds the wait).
      const std::string why = e.what();
      l->control.push_back({make_control_frame(frame_kind::refuse, why.data(), std::min<std::size_t>(why.size(), max_control_body))});
      l->ph = link::phase::refusing;
      pending.erase(l);
      silent.remove(l);
      if (l->dialer) {
        peer& p = *peers[l->peer];
        p.backoff = max_backoff;
      }
      pump(l);
    }
  }

  // The link authenticated: resume the session with its peer or start a new one.
  void establish(const link_ptr& l, const session_info& their) {
    const uint32_t j = static_cast<uint32_t>(l->peer);
    peer& p = *peers[j];
    pending.erase(l);
    silent.remove(l);
    l->deadline.cancel();
    if (l->dialer) {
      p.dialing = false;
      p.backoff = first_backoff;
    }
    if (!p.s.offered(l->sent)) {
      close_link(l, "the session changed during the handshake");
      return;
    }
    link_ptr old;
    {
      std::lock_guard<std::mutex> lock(p.m);
      old = p.current;
    }
    if (old) close_link(old, "replaced by a new link");
    const std::string down_why = take_session(p, their);
    {
      std::lock_guard<std::mutex> lock(p.m);
      p.current = l;
    }
    protect(*l);
    l->ph = link::phase::established;
    l->reader.allow(session_kinds);
    p.last_rx = steady::now();
    ++c.links_up;
    // The handshake's last frame (the dialer's proof) goes out before the
    // handlers run: a send() they start from another thread must not write
    // a message ahead of it.
    pump(l);
    if (!down_why.empty() && handlers.on_peer_down) handlers.on_peer_down(j, down_why, false);
    if (p.s.open() && handlers.on_peer_up) handlers.on_peer_up(j);
    std::shared_ptr<lane_ring> reoffer;  // an offer the last link may have lost
    {
      std::lock_guard<std::mutex> lock(p.m);
      if (p.lane == peer::lane_state::offered) reoffer = p.ring;
    }
    if (reoffer && l->ph == link::phase::established) send_lane_offer(l, *reoffer);
    if (l->ph == link::phase::established) pump(l);
  }

  // Every frame from here on is sealed and opened with the link's own keys
  // (the dialer's proof, queued before this, goes out as it is).
  void protect(link& l) {
    const link_keys& k = l.dialer ? l.dialer_hs->keys() : l.acceptor_hs->keys();
    l.sealer = std::make_unique<frame_cipher>(k.send, frame_cipher::direction::seal, opt.encrypt);
    l.reader.protect(std::make_unique<frame_cipher>(k.receive, frame_cipher::direction::open, opt.encrypt));
  }

  // ---- sessions ----

  // A new link resumes the session with `p` (the frames not acknowledged go
  // again) or starts another; returns why the old one ended ("": it did not).
  std::string take_session(peer& p, const session_info& their) {
    session::outcome o;
    {
      std::lock_guard<std::mutex> lock(p.m);
      o = p.s.take(their);
    }
    if (o != session::outcome::resumed) drop_lanes(p);
    switch (o) {
      case session::outcome::restarted: return "node " + std::to_string(p.node) + " restarted";
      case session::outcome::abandoned:
        return "node " + std::to_string(p.node) + " ended the session (it had declared this node dead)";
      default: return {};
    }
  }

  void peer_down(peer& p, const std::string& why, bool goodbye = false) {
    link_ptr l;
    {
      std::lock_guard<std::mutex> lock(p.m);
      l = p.current;
    }
    if (l) close_link(l, why);
    if (!p.s.up()) return;
    {
      std::lock_guard<std::mutex> lock(p.m);
      p.s.close(true);
    }
    drop_lanes(p);
    if (handlers.on_peer_down) handlers.on_peer_down(p.node, why, goodbye);
  }

  // ---- reading ----

  void read(const link_ptr& l) {
    auto buf = l->reader.next_buffer();
    l->sock.async_read_some(asio::buffer(buf.begin(), buf.size()),
                            [this, l](const boost::system::error_code& ec, std::size_t n) { on_read(l, ec, n); });
  }

  peer* established_peer(const link_ptr& l) {
    if (l->ph != link::phase::established) return nullptr;
    peer& p = *peers[l->peer];
    std::lock_guard<std::mutex> lock(p.m);
    return p.current == l ? &p : nullptr;
  }

  void on_read(const link_ptr& l, const boost::system::error_code& ec, std::size_t n) {
    if (l->ph == link::phase::closed) return;
    if (ec) {
      close_link(l, ec == asio::error::eof ? "closed by the peer" : ec.message());
      return;
    }
    l->reader.commit(n);
    c.bytes_received += n;
    if (l->ph == link::phase::refusing) return;
    if (peer* p = established_peer(l)) p->last_rx = steady::now();
    in_frame f;
    for (;;) {
      try {
        if (!l->reader.next(f)) break;
      } catch (const frame_exception& e) {
        ++c.rejected_frames[static_cast<int>(e.reason())];
        reject(*l, to_string(e.reason()), describe(*l) + ": " + e.what() + (e.fatal() ? "; link closed" : ""));
        if (e.fatal()) {
          close_link(l, e.what());
          return;
        }
        continue;
      }
      if (l->ph == link::phase::established)
        on_session_frame(l, f);
      else
        on_handshake_frame(l, f);
      if (l->ph != link::phase::handshake && l->ph != link::phase::established) return;
    }
    if (!l->reader.mid_frame())
      l->frame_began = {};
    else if (l->frame_began == steady::time_point{})
      l->frame_began = steady::now();
    if (peer* p = established_peer(l)) maybe_acknowledge(*p, l);
    read(l);
  }

  void on_session_frame(const link_ptr& l, in_frame& f) {
    peer* pp = established_peer(l);
    if (!pp) return;
    peer& p = *pp;
    {
      std::lock_guard<std::mutex> lock(p.m);
      p.s.acknowledge(std::min(f.header.ack, p.s.last_sent()));
    }
    switch (f.header.kind) {
      case frame_kind::heartbeat: ++c.heartbeats_received; return;
      case frame_kind::goodbye: peer_down(p, "node " + std::to_string(p.node) + " stopped (it said goodbye)", true); return;
      case frame_kind::lane_offer: on_lane_offer(l, p, f); return;
      case frame_kind::lane_accept: on_lane_accept(p, f); return;
      case frame_kind::message:
      case frame_kind::message_ref: break;
      default: return;  // the reader allows no other kind now
    }
    const uint64_t seq = f.header.sequence;
    if (p.s.duplicate(seq)) return;
    if (f.header.kind == frame_kind::message_ref && !take_from_lane(*l, p, f)) {
      p.s.skip(seq);  // counted as delivered, handed to no one
      return;
    }
    if (f.source.node != p.node) {
      // Counted as delivered (the sequence goes on), handed to no one.
      p.s.skip(seq);
      ++c.rejected_frames[static_cast<int>(frame_error::wrong_source)];
      reject(*l, to_string(frame_error::wrong_source),
             describe(*l) + ": a message claiming to come from node " + std::to_string(f.source.node) +
                 " on the link of node " + std::to_string(p.node) + "; dropped");
      return;
    }
    p.s.deliver(seq, f.msg.bytes());
    ++c.frames_received;
    if (!handlers.on_message) return;
    try {
      handlers.on_message(p.node, f.header.destination, std::move(f.msg));
    } catch (const std::exception& e) {
      ++c.handler_errors;
      reject(*l, "handler_error", "on_message for a message from node " + std::to_string(p.node) + " threw: " + e.what());
    }
  }

  // ---- same-host lanes (net/shm_lane.hpp) ----

  // The session with `p` ended or was renewed: its lanes go (messages taken from the peer's keep its region).
  void drop_lanes(peer& p) {
    {
      std::lock_guard<std::mutex> lock(p.m);
      p.ring.reset();
      p.lane = peer::lane_state::none;
    }
    p.view.reset();
  }

  // send() asked for a lane to `p`: the region is made here, off the sender's thread, and offered.
  void offer_lane(peer& p) {
    std::shared_ptr<lane_ring> ring;
    std::string why;
    try {
      ring = lane_ring::create(opt.lane_bytes);
    } catch (const std::exception& e) {
      why = e.what();
    }
    link_ptr l;
    {
      std::lock_guard<std::mutex> lock(p.m);
      if (p.lane != peer::lane_state::creating) return;  // the session ended meanwhile
      p.lane = ring ? peer::lane_state::offered : peer::lane_state::unavailable;
      p.ring = ring;
      l = p.current;
    }
    if (!ring) {
      if (l) reject(*l, "no_lane", "no same-host lane to " + describe(*l) + ": " + why + "; its messages go through the socket");
      return;
    }
    if (l) send_lane_offer(l, *ring);
  }

  void send_lane_offer(const link_ptr& l, const lane_ring& r) {
    const std::string body = encode_lane_offer(r.offer());
    l->control.push_back({make_control_frame(frame_kind::lane_offer, body.data(), body.size())});
    pump(l);
  }

  void on_lane_offer(const link_ptr& l, peer& p, const in_frame& f) {
    if (opt.lane_bytes == 0 || !l->local) return;  // not accepted: the peer goes on through the socket
    uint64_t id = 0;
    try {
      const lane_offer o = decode_lane_offer(f.body.data(), f.body.size());
      if (!p.view || p.view->id() != o.id) p.view = lane_view::open(o);
      id = o.id;
    } catch (const std::exception& e) {
      reject(*l, "no_lane", describe(*l) + " offered a same-host lane that is not used: " + e.what());
      return;
    }
    l->control.push_back({make_control_frame(frame_kind::lane_accept, &id, sizeof id)});
    pump(l);
  }

  void on_lane_accept(peer& p, const in_frame& f) {
    uint64_t id = 0;
    if (f.body.size() != sizeof id) return;
    std::memcpy(&id, f.body.data(), sizeof id);
    std::lock_guard<std::mutex> lock(p.m);
    if (p.lane == peer::lane_state::offered && p.ring && p.ring->id() == id) {
      p.lane = peer::lane_state::up;
      ++c.lanes_up;
    }
  }

  // A message_ref frame: its message, read in place in the peer's lane (the slot
  // released when its last holder lets go). False, rejected and counted, when it cannot be.
  bool take_from_lane(const link& l, peer& p, in_frame& f) {
    const message_ref r = decode_message_ref(f.body);
    uint64_t words = 0;
    for (uint32_t n : f.sizes) words += n;
    std::string why;
    const capnp::word* at = nullptr;
    std::shared_ptr<const void> owner;
    if (!p.view || p.view->id() != r.lane)
      why = "it names a lane this node did not map from node " + std::to_string(p.node);
    else if (words * 8 != r.bytes)
      why = "its segments take " + std::to_string(words * 8) + " bytes, its reference " + std::to_string(r.bytes);
    else
      owner = p.view->take(r.offset, r.bytes, &at, &why);
    frame_error e = frame_error::bad_lane;
    if (owner) {
      f.msg = message::from_segments(std::move(owner), at, kj::arrayPtr(f.sizes.data(), f.sizes.size()));
      try {
        f.source = read_header(f.msg).source;
        ++c.lane_frames_received;
        c.lane_bytes_received += r.bytes;
        return true;
      } catch (const message_error& x) {
        f.msg = message();
        e = frame_error::bad_envelope;
        why = x.what();
      }
    }
    ++c.rejected_frames[static_cast<int>(e)];
    reject(l, to_string(e), describe(l) + ": message_ref frame " + std::to_string(f.header.sequence) + " rejected: " + why + "; dropped");
    return false;
  }

  void maybe_acknowledge(peer& p, const link_ptr& l) {
    if (!p.s.ack_due()) return;
    send_heartbeat(l);
  }

  void send_heartbeat(const link_ptr& l) {
    for (auto& q : l->control)
      if (q.f.kind == frame_kind::heartbeat) return;
    l->control.push_back({make_control_frame(frame_kind::heartbeat)});
    pump(l);
  }

  // ---- writing ----

  void decide_faults(frame_faults& q) {
    q.decided = true;
    std::uniform_real_distribution<double> u(0.0, 1.0);
    const fault_options& fo = opt.faults;
    q.drop = fo.drop > 0 && u(rng) < fo.drop;
    q.duplicate = fo.duplicate > 0 && u(rng) < fo.duplicate;
    q.delay = fo.delay > 0 && u(rng) < fo.delay;
    q.disconnect = fo.disconnect > 0 && u(rng) < fo.disconnect;
  }

  // Starts a gather write of what waits for `l`: its control frames, then (once
  // established) its peer's queue. Runs on the io thread.
  void pump(const link_ptr& l) {
    if (l->ph == link::phase::closed || l->ph == link::phase::connecting) return;
    peer* p = l->ph == link::phase::established ? peers[l->peer].get() : nullptr;
    std::unique_lock<std::mutex> lock;
    if (p) {
      lock = std::unique_lock<std::mutex>(p->m);
      p->kick_pending = false;
      if (p->current != l) return;
    }
    if (l->writing) return;
    l->in_flight.clear();
    while (!l->control.empty()) {
      l->in_flight.push_back(std::move(l->control.front()));
      l->control.pop_front();
    }
    if (p) {
      std::size_t batch_bytes = 0;
      while (l->in_flight.size() < max_batch_frames && batch_bytes < max_batch_bytes) {
        queued* q = p->s.front();
        if (!q) break;
        if (opt.faults.any() && !q->faults.decided) decide_faults(q->faults);
        if (q->faults.delay && !q->faults.delayed) {
          if (!l->in_flight.empty()) break;  // what is before it goes first
          q->faults.delayed = true;
          hold_back(l);
          return;
        }
        l->in_flight.push_back(p->s.pop_front());
        batch_bytes += l->in_flight.back().f.bytes();
      }
    }
    if (l->in_flight.empty()) return;
    l->writing = true;
    if (lock.owns_lock()) lock.unlock();
    write_in_flight(l, p);
  }

  // Fault injection: the link writes nothing for delay_by (its peer's mutex held).
  void hold_back(const link_ptr& l) {
    ++c.faults_delayed;
    l->writing = true;
    l->delay_timer.expires_after(opt.faults.delay_by);
    l->delay_timer.async_wait([this, l](const boost::system::error_code& ec) {
      if (ec || l->ph != link::phase::established) return;
      {
        std::lock_guard<std::mutex> lock(peers[l->peer]->m);
        l->writing = false;
      }
      pump(l);
    });
  }

  // Frames of the session are sealed, the handshake's are not (they have no keys yet).
  static bool sealed_kind(frame_kind k) { return (session_kinds & kind_bit(k)) != 0; }

  void write_in_flight(const link_ptr& l, peer* p) {
    l->buffers.clear();
    l->copies.clear();
    auto add = [&](out_frame& f) {
      if (l->sealer && sealed_kind(f.kind)) f.seal(*l->sealer, send_pool);
      f.for_each_piece([&](const std::byte* d, std::size_t n) { l->buffers.emplace_back(d, n); });
    };
    for (auto& q : l->in_flight) {
      if (p && (carries_message(q.f.kind) || q.f.kind == frame_kind::heartbeat)) q.f.set_ack(p->s.delivered());
      if (q.f.kind == frame_kind::heartbeat) ++c.heartbeats_sent;
      if (!carries_message(q.f.kind)) {
        add(q.f);
        continue;
      }
      if (q.faults.drop) {
        ++c.faults_dropped;
        continue;
      }
      add(q.f);
      ++c.frames_sent;
      if (q.faults.duplicate) {
        l->copies.push_back(q.f);
        add(l->copies.back());
        ++c.faults_duplicated;
      }
      if (q.faults.disconnect) {
        q.faults.disconnect = false;
        l->disconnect_after = true;
        ++c.faults_disconnected;
      }
    }
    if (p) p->s.ack_sent();
    if (l->buffers.empty()) {
      asio::post(io, [this, l] { on_written(l, {}, 0); });
      return;
    }
    asio::async_write(l->sock, l->buffers, whole_buffers,
                      [this, l](const boost::system::error_code& ec, std::size_t n) { on_written(l, ec, n); });
  }

  void on_written(const link_ptr& l, const boost::system::error_code& ec, std::size_t n) {
    if (l->ph == link::phase::closed) return;  // close_link took the frames in flight
    c.bytes_sent += n;
    l->last_tx = steady::now().time_since_epoch().count();
    if (ec) {
      close_link(l, "write failed: " + ec.message());
      return;
    }
    if (l->ph == link::phase::refusing) {
      close_link(l, "refused");
      return;
    }
    if (l->disconnect_after) {
      close_link(l, "fault injection: disconnect");
      return;
    }
    if (l->ph == link::phase::established) {
      peer& p = *peers[l->peer];
      std::lock_guard<std::mutex> lock(p.m);
      for (auto& q : l->in_flight)
        if (carries_message(q.f.kind)) {
          q.f.cipher.reset();  // a resend seals it again, under the next link's key
          p.s.written(std::move(q));
        }
      l->in_flight.clear();
      l->writing = false;
    } else {
      l->in_flight.clear();
      l->writing = false;
    }
    pump(l);
  }

  // ---- closing ----

  void close_link(const link_ptr& l, const std::string& why) {
    if (l->ph == link::phase::closed) return;
    const auto was = l->ph;
    l->ph = link::phase::closed;
    boost::system::error_code ec;
    l->deadline.cancel();
    l->delay_timer.cancel();
    pending.erase(l);
    silent.remove(l);
    if (l->peer < 0) {
      l->sock.close(ec);
      return;
    }
    peer& p = *peers[l->peer];
    bool was_current = false;
    {
      std::lock_guard<std::mutex> lock(p.m);
      was_current = p.current == l;
      if (was_current) {
        p.current.reset();
        // Frames being written come after the unacknowledged ones: the next link sends them again.
        for (auto& q : l->in_flight)
          if (carries_message(q.f.kind)) p.s.interrupted(std::move(q));
        l->in_flight.clear();
      }
      l->sock.close(ec);
    }
    if (l->peer >= static_cast<int64_t>(opt.self)) return;  // they dial us
    if (l->dialer && was != link::phase::established) {
      p.dialing = false;
      const milliseconds wait = p.backoff;
      p.backoff = std::min(max_backoff, p.backoff * 2);
      schedule_dial(static_cast<uint32_t>(l->peer), wait);
    } else if (was_current) {
      schedule_dial(static_cast<uint32_t>(l->peer), milliseconds(0));
    }
    (void)why;
  }

  // ---- liveness ----

  milliseconds tick_interval() const {
    auto t = std::min(opt.heartbeat / 2, opt.peer_timeout / 4);
    return std::clamp(t, milliseconds(5), milliseconds(250));
  }

  void schedule_tick() {
    tick_timer.expires_after(tick_interval());
    tick_timer.async_wait([this](const boost::system::error_code& ec) {
      if (ec || stopped) return;
      tick();
      schedule_tick();
    });
  }

  void tick() {
    const auto now = steady::now();
    for (auto& pp : peers) {
      peer& p = *pp;
      if (p.node == opt.self) continue;
      if (p.s.up() && now - p.last_rx > opt.peer_timeout) {
        const auto silent = std::chrono::duration_cast<milliseconds>(now - p.last_rx);
        peer_down(p, "no frame from node " + std::to_string(p.node) + " for " + millis(silent) + " (timeout " +
                         millis(opt.peer_timeout) + "): dead or frozen");
        continue;
      }
      link_ptr l;
      {
        std::lock_guard<std::mutex> lock(p.m);
        l = p.current;
      }
      if (l && frame_overdue(*l, now)) {
        ++c.rejected_frames[static_cast<int>(frame_error::frame_timeout)];
        const std::string what = describe(*l) + ": a frame of " + std::to_string(l->reader.frame_bytes()) +
                                 " bytes is not whole after " +
                                 millis(std::chrono::duration_cast<milliseconds>(now - l->frame_began)) +
                                 " (stalled or trickling); link closed";
        reject(*l, to_string(frame_error::frame_timeout), what);
        close_link(l, what);
        continue;
      }
      if (l && !l->writing && now - steady::time_point(steady::duration(l->last_tx)) >= opt.heartbeat)
        send_heartbeat(l);
    }
  }

  // A frame begun must be whole within peer_timeout + its bytes at min_frame_bytes_per_s.
  bool frame_overdue(const link& l, steady::time_point now) const {
    if (l.frame_began == steady::time_point{} || !l.reader.mid_frame()) return false;
    const double allowed_s = std::chrono::duration<double>(opt.peer_timeout).count() +
                             static_cast<double>(l.reader.frame_bytes()) / opt.min_frame_bytes_per_s;
    return std::chrono::duration<double>(now - l.frame_began).count() > allowed_s;
  }

  // ---- sending (any thread) ----

  bool send(uint32_t node, const address& destination, const message& m, int priority) {
    if (node >= opt.nodes.size() || node == opt.self)
      throw error("transport::send: node " + std::to_string(node) +
                  (node == opt.self ? " is this node (deliver locally)" : " is not in the node list"));
    if (m.empty()) throw error("transport::send: an empty message");
    if (stopped) {
      ++c.send_refused;
      return false;
    }
    out_frame f = make_message_frame(destination, m, 1);
    if (f.plain_bytes() > opt.max_frame_bytes)
      throw error("transport::send: a message of " + std::to_string(f.plain_bytes()) + " bytes exceeds max_frame_bytes (" +
                  std::to_string(opt.max_frame_bytes) + ")");
    peer& p = *peers[node];
    std::shared_ptr<lane_ring> ring;
    queued q{lane_or_socket(p, std::move(f), ring), priority};
    link_ptr kick;
    const bool io_thread = on_io_thread();
    {
      std::lock_guard<std::mutex> lock(p.m);
      if (ring && p.ring != ring) q.f = make_message_frame(destination, m, 1);  // the session changed meanwhile
      const uint64_t bytes = q.f.plain_bytes();
      if (!p.s.admit(bytes)) {
        ++c.send_refused;
        return false;
      }
      const bool idle = p.current && !p.current->writing && !p.kick_pending;
      if (idle && !io_thread && p.s.queue_empty() && !opt.faults.any() &&
          steady::now() - steady::time_point(steady::duration(p.current->last_tx)) >= direct_write_idle) {
        p.s.number(q);
        return write_now(p, std::move(q));
      }
      p.s.enqueue(std::move(q));
      if (idle) {
        p.kick_pending = true;
        kick = p.current;
      }
    }
    if (kick) {
      if (io_thread)
        pump(kick);
      else
        asio::post(io, [this, kick] { pump(kick); });
    }
    return true;
  }

  // The frame to send: through the peer's same-host lane when one is up and
  // the message is large (`ring` set to it), else `socket_frame` as it is. A
  // large message to a local peer without a lane yet asks the io thread for one.
  out_frame lane_or_socket(peer& p, out_frame&& socket_frame, std::shared_ptr<lane_ring>& ring) {
    const std::size_t bytes = socket_frame.plain_bytes() - socket_frame.head.size();  // the segments'
    if (opt.lane_bytes == 0 || bytes < lane_min_message_bytes) return std::move(socket_frame);
    {
      std::lock_guard<std::mutex> lock(p.m);
      if (p.lane == peer::lane_state::up) {
        ring = p.ring;
      } else if (p.lane == peer::lane_state::none && p.current && p.current->local) {
        p.lane = peer::lane_state::creating;
        asio::post(io, [this, &p] { offer_lane(p); });
      }
    }
    if (!ring) return std::move(socket_frame);
    const auto slot = ring->allocate(bytes);
    if (!slot) {
      ++c.lane_full;
      ring.reset();
      return std::move(socket_frame);
    }
    std::byte* at = slot->data;
    for (const auto& s : socket_frame.segments) {
      std::memcpy(at, s.begin(), s.size() * sizeof(capnp::word));
      at += s.size() * sizeof(capnp::word);
    }
    ring->publish(*slot);
    ++c.lane_frames_sent;
    c.lane_bytes_sent += bytes;
    return make_message_ref_frame(socket_frame, {ring->id(), slot->offset, bytes});
  }

  // send() on an idle link from another thread: the caller writes the frame
  // itself (non-blocking), sparing the hand-off to the io thread. What does
  // not fit in the socket now is finished by the io thread. Holds p.m, which
  // also keeps the io thread from closing the socket meanwhile.
  bool write_now(peer& p, queued&& q) {
    const link_ptr& l = p.current;
    q.f.set_ack(p.s.delivered_any_thread());
    if (l->sealer) q.f.seal(*l->sealer, send_pool);
    std::vector<iovec> iov;
    iov.reserve(2 + q.f.segments.size());
    q.f.for_each_piece(
        [&](const std::byte* d, std::size_t n) { iov.push_back({const_cast<std::byte*>(d), n}); });
    msghdr mh{};
    mh.msg_iov = iov.data();
    mh.msg_iovlen = iov.size();
    const ssize_t n = ::sendmsg(l->sock.native_handle(), &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    const std::size_t written = n > 0 ? static_cast<std::size_t>(n) : 0;
    c.bytes_sent += written;
    ++c.frames_sent;
    if (written == q.f.bytes()) {
      l->last_tx = steady::now().time_since_epoch().count();
      p.s.written(std::move(q));
      return true;
    }
    // The rest (or, after an error, all of it: the async write then fails and closes the link).
    l->writing = true;
    l->in_flight.clear();
    l->in_flight.push_back(std::move(q));
    asio::post(io, [this, l, written] { finish_write(l, written); });
    return true;
  }

  void finish_write(const link_ptr& l, std::size_t skip) {
    if (l->ph != link::phase::established) return;  // close_link took the frame
    l->buffers.clear();
    const out_frame& f = l->in_flight.front().f;
    auto add = [&](const void* data, std::size_t size) {
      if (skip >= size) {
        skip -= size;
        return;
      }
      l->buffers.emplace_back(static_cast<const std::byte*>(data) + skip, size - skip);
      skip = 0;
    };
    f.for_each_piece([&](const std::byte* d, std::size_t n) { add(d, n); });
    asio::async_write(l->sock, l->buffers, whole_buffers,
                      [this, l](const boost::system::error_code& ec, std::size_t n) { on_written(l, ec, n); });
  }

  transport_stats stats() const {
    transport_stats s;
    s.frames_sent = c.frames_sent;
    s.bytes_sent = c.bytes_sent;
    s.frames_received = c.frames_received;
    s.bytes_received = c.bytes_received;
    s.heartbeats_sent = c.heartbeats_sent;
    s.heartbeats_received = c.heartbeats_received;
    s.resent = c.sessions.resent;
    s.duplicates_dropped = c.sessions.duplicates_dropped;
    s.lost = c.sessions.lost;
    s.send_refused = c.send_refused;
    s.dropped_at_down = c.sessions.dropped_at_down;
    s.faults_dropped = c.faults_dropped;
    s.faults_delayed = c.faults_delayed;
    s.faults_duplicated = c.faults_duplicated;
    s.faults_disconnected = c.faults_disconnected;
    s.links_up = c.links_up;
    s.handler_errors = c.handler_errors;
    for (int i = 0; i < frame_errors; ++i) s.rejected_frames[i] = c.rejected_frames[i];
    for (int i = 0; i < auth_errors; ++i) s.rejected_handshakes[i] = c.rejected_handshakes[i];
    s.refused_connections = c.refused_connections;
    s.peers_up = c.sessions.up;
    s.lane_frames_sent = c.lane_frames_sent;
    s.lane_bytes_sent = c.lane_bytes_sent;
    s.lane_frames_received = c.lane_frames_received;
    s.lane_bytes_received = c.lane_bytes_received;
    s.lanes_up = c.lanes_up;
    s.lane_full = c.lane_full;
    return s;
  }
};

transport::transport(transport_options o, transport_handlers h) : impl_(std::make_unique<impl>(std::move(o), std::move(h))) {}

transport::~transport() {
  try {
    stop();
  } catch (...) {
  }
}

void transport::start() { impl_->start(); }
bool transport::send(uint32_t node, const address& destination, const message& m, int priority) {
  return impl_->send(node, destination, m, priority);
}
void transport::stop() { impl_->stop(); }
transport_stats transport::stats() const { return impl_->stats(); }
uint16_t transport::local_port() const { return impl_->port; }
bool transport::peer_up(uint32_t node) const { return node < impl_->peers.size() && impl_->peers[node]->s.up(); }

} // namespace troupe::net
