// Tensor transfer between two processes on this machine: troupe's transport
// (net/transport.hpp: frames, gather writes, pooled receive buffers, the
// handshake done once) against a raw Boost.Asio socket pair moving the same
// bytes (a length and the payload per message, blocking reads into one reused
// buffer), interleaved in one run; and a small request/reply round trip against
// a bare Asio ping-pong of as many bytes.
//
// The parent is node 1 (it sends and times), a forked child node 0 (it
// receives, acknowledges the last message of a batch, answers pings from its
// io thread). Medians over the repetitions; the ratio is the median of the
// per-repetition ratios troupe / raw.
//
//   build/bench/troupe_transfer_bench [--reps N] [--sizes 4K,1M,16M,100M|none] [--pings N] [--host 127.0.0.1] [--encrypt]
//       [--sender-host ADDR --receiver-netns NAME]
// With --receiver-netns the receiver joins network namespace NAME
// (/var/run/netns/NAME, root only) before it opens a socket, so that the bytes
// cross a veth pair: --host is then its address there, --sender-host the
// parent's (bench/fit_link.sh veth sets this up).
#include <boost/asio.hpp>
#include <capnp/message.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <limits>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "net/transport.hpp"

using namespace troupe;
using namespace troupe::net;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using clock_type = std::chrono::steady_clock;

namespace {

struct config {
  int reps = 9;
  int pings = 2000;
  std::vector<std::size_t> sizes = {4 << 10, 1 << 20, 16 << 20, 100 << 20};
  std::string host = "127.0.0.1";  // the receiver's address
  std::string sender_host;          // the sender's (empty: host)
  std::string receiver_netns;       // the receiver's network namespace (empty: this one)
  bool encrypt = false;             // frames' payloads encrypted too (always authenticated)
};

std::size_t parse_size(const std::string& s) {
  std::size_t n = std::stoull(s);
  if (s.back() == 'K' || s.back() == 'k') n <<= 10;
  if (s.back() == 'M' || s.back() == 'm') n <<= 20;
  return n;
}

std::string size_name(std::size_t n) {
  if (n >= (1 << 20) && n % (1 << 20) == 0) return std::to_string(n >> 20) + " MiB";
  if (n >= 1024 && n % 1024 == 0) return std::to_string(n >> 10) + " KiB";
  return std::to_string(n) + " B";
}

// Messages per repetition: at least 256 MiB, and 3 messages.
std::size_t count_for(std::size_t size) { return std::max<std::size_t>(3, (std::size_t(256) << 20) / size); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/// Moves this process into network namespace `name` (ip netns's /var/run/netns/NAME).
void join_netns(const std::string& name) {
  const std::string path = "/var/run/netns/" + name;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  const int rc = ::setns(fd, CLONE_NEWNET);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw std::runtime_error("cannot join network namespace " + name + ": " + std::strerror(err));
}

std::vector<uint16_t> free_ports(std::size_t n, const std::string& host) {
  asio::io_context io;
  std::vector<tcp::acceptor> held;
  std::vector<uint16_t> ports;
  for (std::size_t i = 0; i < n; ++i) {
    held.emplace_back(io, tcp::endpoint(asio::ip::make_address(host), 0));
    ports.push_back(held.back().local_endpoint().port());
  }
  return ports;
}

// As much as the socket takes per write, as troupe's transport writes (Asio's
// transfer_all stops each write at 64 KiB; uncapped writes measured faster for both).
std::size_t whole_buffers(const boost::system::error_code& ec, std::size_t) {
  return ec ? 0 : std::numeric_limits<std::size_t>::max();
}

// A tensor message: an Activation of `bytes` payload bytes; `last` marks the end of a batch.
message data_message(std::size_t bytes, bool last) {
  auto b = make_builder(bytes);
  auto env = init_envelope(*b, {1, role::worker, 0}, {0, role::worker, 0});
  auto a = env.initActivation();
  a.setStage(last ? 1 : 0);
  auto t = a.initTensor();
  t.setDtype(wire::DType::F32);
  t.initShape(1).set(0, static_cast<int64_t>(bytes / 4));
  auto d = t.initData(static_cast<unsigned>(bytes));
  std::memset(d.begin(), 0x3f, d.size());
  return message::from_builder(std::move(b));
}

message control_message(uint32_t from, uint32_t to, wire::Control::Kind kind) {
  auto b = make_builder();
  auto c = init_envelope(*b, {from, role::worker, 0}, {to, role::worker, 0}).initControl();
  c.setKind(kind);
  c.setAmount(1);
  return message::from_builder(std::move(b));
}

// The envelope's kind and, for an Activation, whether it ends a batch: two
// pointer reads, no validation (the raw side validates nothing either).
std::pair<wire::Envelope::Which, bool> peek(const message& m) {
  capnp::ReaderOptions o;
  o.traversalLimitInWords = ~uint64_t(0) >> 4;
  capnp::SegmentArrayMessageReader r(m.segments(), o);
  auto env = r.getRoot<wire::Envelope>();
  const auto w = env.which();
  return {w, w == wire::Envelope::ACTIVATION && env.getActivation().getStage() == 1};
}

transport_options options_for(const config& cfg, const std::vector<uint16_t>& ports, uint32_t self) {
  transport_options o;
  o.self = self;
  o.nodes = {{"receiver", cfg.host, ports[0]}, {"sender", cfg.sender_host, ports[1]}};
  o.secret = "transfer-bench-secret";
  o.job_hash = "transfer-bench";
  o.max_frame_bytes = uint64_t(1) << 30;
  o.max_queue_bytes = uint64_t(4) << 30;
  o.pool_bytes = std::size_t(1) << 30;
  o.encrypt = cfg.encrypt;
  return o;
}

// Commands on the raw connection, parent -> child.
struct command {
  uint32_t op;  // 0 quit, 1 throughput, 2 ping-pong
  uint32_t pad;
  uint64_t size, count;
};

// ---- the child: node 0 ----

int run_child(const config& cfg, const std::vector<uint16_t>& ports) {
  std::unique_ptr<transport> t;
  transport_handlers h;
  h.on_message = [&](uint32_t node, const address&, message m) {
    auto [kind, last] = peek(m);
    if (kind == wire::Envelope::CONTROL) {
      t->send(node, {node, role::worker, 0}, control_message(0, 1, wire::Control::Kind::HEARTBEAT));  // pong
    } else if (last) {
      t->send(node, {node, role::worker, 0}, control_message(0, 1, wire::Control::Kind::CREDIT));  // batch done
    }
  };
  t = std::make_unique<transport>(options_for(cfg, ports, 0), h);
  t->start();

  asio::io_context io;
  tcp::acceptor acc(io, tcp::endpoint(asio::ip::make_address(cfg.host), ports[2]));
  tcp::socket s(io);
  acc.accept(s);
  s.set_option(tcp::no_delay(true));
  std::vector<char> buf;
  for (;;) {
    command c{};
    asio::read(s, asio::buffer(&c, sizeof c));
    if (c.op == 0) break;
    if (buf.size() < c.size) buf.resize(c.size);
    if (c.op == 1) {
      for (uint64_t k = 0; k < c.count; ++k) {
        uint64_t len = 0;
        asio::read(s, asio::buffer(&len, sizeof len));
        asio::read(s, asio::buffer(buf.data(), len));  // 64 KiB per read: faster here than larger reads
      }
      char ack = 1;
      asio::write(s, asio::buffer(&ack, 1));
    } else {
      for (uint64_t k = 0; k < c.count; ++k) {
        asio::read(s, asio::buffer(buf.data(), c.size));
        asio::write(s, asio::buffer(buf.data(), c.size));
      }
    }
  }
  t->stop();
  return 0;
}

// ---- the parent: node 1 ----

class replies {
public:
  void arrived(wire::Control::Kind k) {
    std::lock_guard<std::mutex> lock(m_);
    ++(k == wire::Control::Kind::CREDIT ? batches_ : pongs_);
    cv_.notify_one();
  }
  void wait_batches(uint64_t n) { wait(batches_, n); }
  void wait_pongs(uint64_t n) { wait(pongs_, n); }

private:
  void wait(const uint64_t& counter, uint64_t n) {
    std::unique_lock<std::mutex> lock(m_);
    if (!cv_.wait_for(lock, std::chrono::seconds(60), [&] { return counter >= n; }))
      throw std::runtime_error("transfer_bench: no reply from the receiver in 60 s");
  }
  std::mutex m_;
  std::condition_variable cv_;
  uint64_t batches_ = 0, pongs_ = 0;
};

// Pings sent from the io thread on each pong, without the application thread.
struct chain {
  std::atomic<int> left{0};
  transport* t = nullptr;
  message ping;
};

struct parent {
  const config& cfg;
  transport& t;
  replies& r;
  tcp::socket& raw;
  chain& ch;
  uint64_t batches = 0, pongs = 0;

  double troupe_throughput(const message& body, const message& last, std::size_t size, std::size_t count) {
    const auto t0 = clock_type::now();
    for (std::size_t k = 0; k + 1 < count; ++k) t.send(0, {0, role::worker, 0}, body);
    t.send(0, {0, role::worker, 0}, last);
    r.wait_batches(++batches);
    return double(size) * count / std::chrono::duration<double>(clock_type::now() - t0).count();
  }

  double raw_throughput(const std::vector<char>& payload, std::size_t size, std::size_t count) {
    const command c{1, 0, size, count};
    asio::write(raw, asio::buffer(&c, sizeof c));
    const uint64_t len = size;
    const auto t0 = clock_type::now();
    for (std::size_t k = 0; k < count; ++k) {
      std::array<asio::const_buffer, 2> b{asio::buffer(&len, sizeof len), asio::buffer(payload.data(), size)};
      asio::write(raw, b, whole_buffers);
    }
    char ack;
    asio::read(raw, asio::buffer(&ack, 1));
    return double(size) * count / std::chrono::duration<double>(clock_type::now() - t0).count();
  }

  double troupe_round_trip(const message& ping, int n) {
    const auto t0 = clock_type::now();
    for (int k = 0; k < n; ++k) {
      t.send(0, {0, role::worker, 0}, ping);
      r.wait_pongs(++pongs);
    }
    return std::chrono::duration<double>(clock_type::now() - t0).count() / n;
  }

  double troupe_round_trip_io(int n) {
    ch.left = n - 1;
    const auto t0 = clock_type::now();
    t.send(0, {0, role::worker, 0}, ch.ping);
    r.wait_pongs(++pongs);
    return std::chrono::duration<double>(clock_type::now() - t0).count() / n;
  }

  double raw_round_trip(std::size_t bytes, int n) {
    const command c{2, 0, bytes, uint64_t(n)};
    asio::write(raw, asio::buffer(&c, sizeof c));
    std::vector<char> b(bytes, 1);
    const auto t0 = clock_type::now();
    for (int k = 0; k < n; ++k) {
      asio::write(raw, asio::buffer(b.data(), bytes));
      asio::read(raw, asio::buffer(b.data(), bytes));
    }
    return std::chrono::duration<double>(clock_type::now() - t0).count() / n;
  }

  // The throughput table: per size, raw and troupe interleaved.
  void throughputs() {
    if (!cfg.sizes.empty())
      std::cout << std::left << std::setw(9) << "size" << std::right << std::setw(10) << "messages" << std::setw(12)
              << "raw GiB/s" << std::setw(14) << "troupe GiB/s" << std::setw(14) << "troupe/raw" << std::setw(18)
              << "ratio min..max" << "\n";
    std::cout.flush();
    constexpr double gib = double(1 << 30);
    for (std::size_t size : cfg.sizes) {
      const std::size_t count = count_for(size);
      const message body = data_message(size, false), last = data_message(size, true);
      const std::vector<char> payload(size, 0x3f);
      // Warm up both paths once (page faults of fresh buffers, the receive pool).
      raw_throughput(payload, size, std::min<std::size_t>(count, 4));
      troupe_throughput(body, last, size, std::min<std::size_t>(count, 4));
      std::vector<double> raw_v, troupe_v, ratio;
      for (int rep = 0; rep < cfg.reps; ++rep) {
        double a, b;
        if (rep % 2 == 0) {
          a = raw_throughput(payload, size, count);
          b = troupe_throughput(body, last, size, count);
        } else {
          b = troupe_throughput(body, last, size, count);
          a = raw_throughput(payload, size, count);
        }
        raw_v.push_back(a / gib);
        troupe_v.push_back(b / gib);
        ratio.push_back(b / a);
      }
      std::ostringstream range;
      range << std::fixed << std::setprecision(2) << *std::min_element(ratio.begin(), ratio.end()) << ".."
            << *std::max_element(ratio.begin(), ratio.end());
      std::cout << std::left << std::setw(9) << size_name(size) << std::right << std::setw(10) << count << std::fixed
                << std::setprecision(2) << std::setw(12) << median(raw_v) << std::setw(14) << median(troupe_v)
                << std::setw(14) << median(ratio) << std::setw(18) << range.str() << "\n";
      std::cout.flush();
    }
  }

  // The round trips of a small frame: bare Asio, troupe from the io thread and from a caller thread.
  void round_trips() {
    const message& ping = ch.ping;
    const std::size_t frame_bytes = make_message_frame({0, role::worker, 0}, ping, 1).bytes();
    raw_round_trip(frame_bytes, 200);
    troupe_round_trip(ping, 200);
    troupe_round_trip_io(200);
    // Three interleaved: bare Asio (blocking, one thread a side), troupe from the io
    // thread (the transport alone), troupe from an application thread (with the hand-offs).
    std::vector<double> raw_v, io_v, app_v, io_ratio, app_ratio;
    for (int rep = 0; rep < cfg.reps; ++rep) {
      double a = 0, b = 0, c = 0;
      for (int k = 0; k < 3; ++k) switch ((rep + k) % 3) {
          case 0: a = raw_round_trip(frame_bytes, cfg.pings); break;
          case 1: b = troupe_round_trip_io(cfg.pings); break;
          default: c = troupe_round_trip(ping, cfg.pings); break;
        }
      raw_v.push_back(a * 1e6);
      io_v.push_back(b * 1e6);
      app_v.push_back(c * 1e6);
      io_ratio.push_back(b / a);
      app_ratio.push_back(c / a);
    }
    auto range = [](const std::vector<double>& v) {
      std::ostringstream o;
      o << std::fixed << std::setprecision(2) << *std::min_element(v.begin(), v.end()) << ".."
        << *std::max_element(v.begin(), v.end());
      return o.str();
    };
    std::cout << std::fixed << "round trip of a " << frame_bytes << "-byte frame, " << cfg.pings << " per repetition:\n"
              << std::setprecision(1) << "  bare Asio ping-pong            " << std::setw(7) << median(raw_v) << " us\n"
              << "  troupe, io thread to io thread " << std::setw(7) << median(io_v) << " us  troupe/bare "
              << std::setprecision(2) << median(io_ratio) << " (" << range(io_ratio) << ")\n"
              << std::setprecision(1) << "  troupe, from a caller thread   " << std::setw(7) << median(app_v)
              << " us  troupe/bare " << std::setprecision(2) << median(app_ratio) << " (" << range(app_ratio) << ")\n";
  }
};

int run_parent(const config& cfg, const std::vector<uint16_t>& ports) {
  replies r;
  chain ch;
  ch.ping = control_message(1, 0, wire::Control::Kind::HEARTBEAT);
  transport_handlers h;
  h.on_message = [&](uint32_t, const address&, message m) {
    capnp::SegmentArrayMessageReader reader(m.segments());
    const auto kind = reader.getRoot<wire::Envelope>().getControl().getKind();
    if (kind == wire::Control::Kind::HEARTBEAT && ch.left > 0) {
      --ch.left;
      ch.t->send(0, {0, role::worker, 0}, ch.ping);
      return;
    }
    r.arrived(kind);
  };
  h.on_rejected = [](const rejection& r) { std::cerr << "rejected: " << r.what << "\n"; };
  transport t(options_for(cfg, ports, 1), h);
  ch.t = &t;
  t.start();

  asio::io_context io;
  tcp::socket raw(io);
  const auto deadline = clock_type::now() + std::chrono::seconds(10);
  for (;;) {
    boost::system::error_code ec;
    raw.connect(tcp::endpoint(asio::ip::make_address(cfg.host), ports[2]), ec);
    if (!ec) break;
    raw.close();
    if (clock_type::now() > deadline) throw std::runtime_error("transfer_bench: the receiver does not listen");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  raw.set_option(tcp::no_delay(true));
  while (!t.peer_up(0)) {
    if (clock_type::now() > deadline) throw std::runtime_error("transfer_bench: no link to the receiver");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }

  parent p{cfg, t, r, raw, ch};
  std::cout << "transfer: troupe transport vs raw Boost.Asio, " << cfg.sender_host << " -> " << cfg.host
            << (cfg.receiver_netns.empty() ? "" : " (network namespace " + cfg.receiver_netns + ")") << ", " << cfg.reps
            << " interleaved repetitions, medians\n";
  p.throughputs();
  p.round_trips();
  const auto s = t.stats();
  std::cout << "troupe sender: " << s.frames_sent << " frames, " << s.bytes_sent / double(1 << 20) << " MiB written, "
            << s.rejected() << " rejected, " << s.resent << " re-sent\n";

  const command quit{0, 0, 0, 0};
  asio::write(raw, asio::buffer(&quit, sizeof quit));
  t.stop();
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  config cfg;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--reps") {
      cfg.reps = std::stoi(value());
    } else if (a == "--pings") {
      cfg.pings = std::stoi(value());
    } else if (a == "--host") {
      cfg.host = value();
    } else if (a == "--sender-host") {
      cfg.sender_host = value();
    } else if (a == "--receiver-netns") {
      cfg.receiver_netns = value();
    } else if (a == "--encrypt") {
      cfg.encrypt = true;
    } else if (a == "--sizes") {
      cfg.sizes.clear();
      std::stringstream ss(value());
      for (std::string x; std::getline(ss, x, ',');)
        if (x != "none") cfg.sizes.push_back(parse_size(x));
    } else {
      std::cerr << "usage: troupe_transfer_bench [--reps N] [--sizes 4K,1M,16M,100M|none] [--pings N] [--host ADDR] "
                   "[--sender-host ADDR --receiver-netns NAME] [--encrypt]\n";
      return 2;
    }
  }
  if (cfg.reps < 1 || cfg.pings < 1) {
    std::cerr << "transfer_bench: --reps and --pings must be >= 1\n";
    return 2;
  }
  if (cfg.sender_host.empty()) cfg.sender_host = cfg.host;
  std::vector<uint16_t> ports;
  if (cfg.receiver_netns.empty()) {
    ports = free_ports(3, cfg.host);
  } else {
    // The receiver's ports are in its own namespace, where nothing else listens.
    const uint16_t base = static_cast<uint16_t>(30000 + ::getpid() % 20000);
    ports = {base, free_ports(1, cfg.sender_host).at(0), static_cast<uint16_t>(base + 1)};
  }
  std::cout.flush();
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("fork");
    return 1;
  }
  if (pid == 0) {
    int rc = 1;
    try {
      if (!cfg.receiver_netns.empty()) join_netns(cfg.receiver_netns);
      rc = run_child(cfg, ports);
    } catch (const std::exception& e) {
      std::cerr << "transfer_bench receiver: " << e.what() << "\n";
    }
    std::cout.flush();
    ::_exit(rc);
  }
  int rc = 1;
  try {
    rc = run_parent(cfg, ports);
  } catch (const std::exception& e) {
    std::cerr << "transfer_bench: " << e.what() << "\n";
    ::kill(pid, SIGKILL);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = rc ? rc : 1;
  return rc;
}
