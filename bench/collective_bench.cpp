// Collective bandwidth between N processes (issue 23), reported as nccl-tests
// does: per size, the median time of one operation after warm-up, algbw =
// bytes / time, busbw = algbw * 2(N-1)/N for an allreduce (algbw for a
// broadcast). One process is one member: the collective core
// (actors/collective_core.hpp) driven by the main thread, its messages as
// Collective envelopes (actors/allreduce.hpp: to_wire/from_wire) on troupe's
// transport (net/transport.hpp), opened and validated as a worker opens them.
//
//   build/bench/troupe_collective_bench --rank R --nodes HOST:PORT,HOST:PORT,... --secret-file FILE
//       [--label loopback] [--sizes 4K,8K,...,64M] [--algorithms ring,doubling,broadcast[,tree]]
//       [--piece 65536] [--pieces 16384,65536,262144 --piece-size 16M]
//       [--warmup 1] [--min-iters 3] [--max-iters 20] [--target-s 3] [--corrupt R] [--lane-mb 64]
//
// --lane-mb sets the same-host lanes' region per peer (net/transport.hpp,
// lane_bytes; 0: every byte through the sockets), so that one binary measures
// loopback with and without them.
// Algorithms: ring and doubling are the allreduce forced to the ring
// (small_threshold_bytes = 0) or to recursive doubling (a threshold above
// every size); broadcast is the chain (threshold 0), tree the binomial tree.
// Every timed operation starts after a barrier (not timed). An allreduce's
// time is the longest of the members' times from the barrier to their end
// (nccl-tests averages them; recursive doubling with N not a power of two is
// not symmetric: the members folded in finish last, and a step waits for them).
// A broadcast's root (rank 0) is done once it has sent, so a broadcast is
// timed on the root up to a barrier after it, less the median time of a bare
// barrier: below some tens of KiB that difference is within the barrier's own
// jitter (it can come out near zero or negative).
//
// After each timed operation every member checks its buffer against the
// exact expected result (small integers: sums are exact in float32) and the
// members agree, by an allreduce of the error counts, before going on: a
// wrong result stops every member with an error (exit status 1); --corrupt R
// makes rank R spoil its result, to see that check fire.
//
// Rank 0 prints one markdown row per (algorithm, size): link, N, algorithm,
// piece, size, iterations, time (median, min, max, in ms), algbw and busbw (MB/s,
// 10^6 bytes). With --pieces, the ring and the broadcast also run at
// --piece-size with each piece size in the list (rows after the sweep).
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <iomanip>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "actors/allreduce.hpp"
#include "actors/collective_core.hpp"
#include "net/auth.hpp"
#include "net/protocol.hpp"
#include "net/transport.hpp"

using namespace troupe;
using namespace troupe::actors;
using clock_type = std::chrono::steady_clock;

namespace {

enum class algo { ring, doubling, broadcast, tree };

const char* algo_name(algo a) {
  switch (a) {
    case algo::ring: return "allreduce ring";
    case algo::doubling: return "allreduce doubling";
    case algo::broadcast: return "broadcast chain";
    case algo::tree: return "broadcast tree";
  }
  return "?";
}

algo parse_algo(const std::string& s) {
  if (s == "ring") return algo::ring;
  if (s == "doubling") return algo::doubling;
  if (s == "broadcast") return algo::broadcast;
  if (s == "tree") return algo::tree;
  throw std::runtime_error("unknown algorithm '" + s + "' (ring, doubling, broadcast, tree)");
}

bool is_allreduce(algo a) { return a == algo::ring || a == algo::doubling; }

struct config {
  int rank = -1;
  std::vector<net::endpoint> nodes;
  std::string secret_file;
  std::string label = "loopback";
  std::vector<std::size_t> sizes;
  std::vector<algo> algorithms = {algo::ring, algo::doubling, algo::broadcast};
  int64_t piece = int64_t{1} << 16;
  std::vector<int64_t> pieces;
  std::size_t piece_size = std::size_t(16) << 20;
  int warmup = 1, min_iters = 3, max_iters = 20;
  double target_s = 3;
  int corrupt = -1;  // a test of the check: this rank spoils its result
  std::size_t lane_bytes = net::transport_options{}.lane_bytes;
};

std::size_t parse_size(const std::string& s) {
  std::size_t n = std::stoull(s);
  if (s.back() == 'K' || s.back() == 'k') n <<= 10;
  if (s.back() == 'M' || s.back() == 'm') n <<= 20;
  if (n == 0 || n % 4 != 0) throw std::runtime_error("size " + s + ": a positive multiple of 4 bytes");
  return n;
}

std::string size_name(std::size_t n) {
  if (n >= (1 << 20) && n % (1 << 20) == 0) return std::to_string(n >> 20) + " MiB";
  if (n >= 1024 && n % 1024 == 0) return std::to_string(n >> 10) + " KiB";
  return std::to_string(n) + " B";
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, sep);)
    if (!x.empty()) out.push_back(x);
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/// The pattern member `rank` contributes: small integers, so that every sum is exact.
float pattern(int rank, std::size_t i) { return static_cast<float>((rank + 1) * static_cast<int>(i % 7 + 1)); }

/// One member: the transport, a queue of arriving messages, the core of the current configuration.
class member {
public:
  explicit member(const config& c) : c_(c), n_(static_cast<int32_t>(c.nodes.size())) {
    for (int32_t i = 0; i < n_; ++i) ids_.push_back(i);
    net::transport_options o;
    o.self = static_cast<uint32_t>(c.rank);
    o.nodes = c.nodes;
    o.secret = net::read_secret_file(c.secret_file);
    o.job_hash = "collective-bench";
    o.peer_timeout = std::chrono::milliseconds(30000);
    o.connect_timeout = std::chrono::milliseconds(5000);
    o.max_queue_bytes = uint64_t(4) << 30;
    o.pool_bytes = std::size_t(256) << 20;
    o.lane_bytes = c.lane_bytes;
    net::transport_handlers h;
    h.on_message = [this](uint32_t, const net::address&, net::message m) {
      std::lock_guard<std::mutex> lock(mu_);
      inbox_.push_back(std::move(m));
      cv_.notify_one();
    };
    h.on_peer_down = [this](uint32_t node, const std::string& why, bool) {
      std::lock_guard<std::mutex> lock(mu_);
      failure_ = "node " + std::to_string(node) + " went down: " + why;
      cv_.notify_one();
    };
    h.on_rejected = [](const net::rejection& r) { std::cerr << "collective_bench: rejected: " << r.what << "\n"; };
    t_ = std::make_unique<net::transport>(o, h);
  }

  void start() {
    t_->start();
    const auto deadline = clock_type::now() + std::chrono::seconds(60);
    for (int32_t i = 0; i < n_; ++i)
      while (i != c_.rank && !t_->peer_up(static_cast<uint32_t>(i))) {
        if (clock_type::now() > deadline) throw std::runtime_error("no link to node " + std::to_string(i) + " in 60 s");
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
  }

  void stop() {
    // The last barrier's messages this member sent may still be queued: let them go out.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    t_->stop();
  }

  /// A fresh core (a new epoch) for the next configuration.
  void configure(const collective_options& o) { core_ = std::make_unique<collective_core>(ids_, c_.rank, ++epoch_, o); }

  void allreduce(float* buffer, int64_t n) { run(core_->start_allreduce(core_->next_op(), buffer, n)); }
  void broadcast(int32_t root, float* buffer, int64_t n) {
    run(core_->start_broadcast(core_->next_op(), root, buffer, n));
  }
  void barrier() { run(core_->start_barrier(core_->next_op())); }
  collective_algorithm last_algorithm() const { return core_->algorithm(); }

  int32_t size() const { return n_; }
  int rank() const { return c_.rank; }

private:
  /// Sends `out`, then feeds arriving messages to the core until its operation is done.
  void run(std::vector<collective_message> out) {
    send(out);
    for (auto it = later_.begin(); it != later_.end() && !core_->done();) {
      if (it->epoch == core_->epoch()) {
        collective_message m = std::move(*it);
        it = later_.erase(it);
        feed(m);
      } else {
        ++it;
      }
    }
    while (!core_->done()) {
      net::message m = next();
      auto r = std::make_shared<const net::envelope_reader>(m, net::peer_limits());
      net::require_accepted(wire::Role::WORKER, *r, "collective_bench member " + std::to_string(c_.rank));
      collective_message cm = view_from_wire(*r);
      if (cm.epoch > core_->epoch()) {  // a member already in the next configuration
        cm.own();
        later_.push_back(std::move(cm));
        continue;
      }
      feed(cm);
    }
  }
  void feed(const collective_message& m) {
    const uint64_t before = core_->stats().total_rejected();
    std::vector<collective_message> out = core_->accept(m);
    if (core_->stats().total_rejected() != before)
      throw std::runtime_error("member " + std::to_string(c_.rank) + " rejected a message: " + core_->last_error());
    send(out);
  }
  void send(const std::vector<collective_message>& out) {
    const net::address me{static_cast<uint32_t>(c_.rank), net::role::worker, 0};
    for (const collective_message& m : out) {
      const net::address to{static_cast<uint32_t>(m.receiver), net::role::worker, 0};
      if (!t_->send(to.node, to, to_wire(m, me, to)))
        throw std::runtime_error("the transport refused a message to node " + std::to_string(to.node));
    }
  }
  net::message next() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(300), [&] { return !inbox_.empty() || !failure_.empty(); }))
      throw std::runtime_error("member " + std::to_string(c_.rank) + ": no message in 300 s");
    if (!failure_.empty()) throw std::runtime_error(failure_);
    net::message m = std::move(inbox_.front());
    inbox_.pop_front();
    return m;
  }

  const config& c_;
  int32_t n_;
  std::vector<int32_t> ids_;
  std::unique_ptr<net::transport> t_;
  std::unique_ptr<collective_core> core_;
  uint64_t epoch_ = 0;
  std::vector<collective_message> later_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<net::message> inbox_;
  std::string failure_;
};

struct row {
  algo a;
  int64_t piece;
  std::size_t bytes;
  int iters;
  double med_s, min_s, max_s;
};

class sweep {
public:
  sweep(const config& c, member& m) : c_(c), m_(m) {}

  /// Measures one (algorithm, piece, size) point; every member runs the same program.
  row measure(algo a, int64_t piece, std::size_t bytes) {
    collective_options o;
    o.piece(piece).ahead(2).views().small_threshold(a == algo::doubling || a == algo::tree ? int64_t{1} << 62 : 0);
    m_.configure(o);
    const int64_t n = static_cast<int64_t>(bytes / sizeof(float));
    buf_.assign(static_cast<std::size_t>(n), 0.0f);
    const int32_t root = 0;
    // One operation: the longest of the members' times from the barrier to
    // their end. A broadcast's root is done once it has sent, so a broadcast
    // is timed on the root up to a barrier after it, less the median time of
    // a bare barrier (measured after the iterations).
    auto once = [&]() {
      fill(a, root);
      m_.barrier();
      const auto t0 = clock_type::now();
      if (is_allreduce(a))
        m_.allreduce(buf_.data(), n);
      else
        m_.broadcast(root, buf_.data(), n);
      const collective_algorithm ran = m_.last_algorithm();
      if (!is_allreduce(a)) m_.barrier();
      const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
      check_algorithm(a, ran);
      if (m_.rank() == c_.corrupt) buf_[buf_.size() / 2] += 1;
      const double longest = verify(a, root, bytes, s);
      return is_allreduce(a) ? longest : s;
    };
    double warm = 0;
    for (int k = 0; k < c_.warmup; ++k) warm = once();
    const int iters = agree_iterations(warm);
    std::vector<double> times;
    for (int k = 0; k < iters; ++k) times.push_back(once());
    double less = 0;
    if (!is_allreduce(a)) less = barrier_time(iters);
    for (double& t : times) t -= less;
    return {a, piece, bytes, iters, median(times), *std::min_element(times.begin(), times.end()),
            *std::max_element(times.begin(), times.end())};
  }

private:
  void fill(algo a, int32_t root) {
    const bool source = is_allreduce(a) || m_.rank() == root;
    for (std::size_t i = 0; i < buf_.size(); ++i) buf_[i] = source ? pattern(m_.rank(), i) : -1.0f;
  }

  /// Every member checks its result; the members sum their error counts (so
  /// that all stop together) and gather their times. Returns the longest.
  double verify(algo a, int32_t root, std::size_t bytes, double seconds) {
    const int nr = m_.size();
    int64_t bad = 0, first = -1;
    for (std::size_t i = 0; i < buf_.size(); ++i) {
      const float want = is_allreduce(a) ? static_cast<float>(nr * (nr + 1) / 2 * static_cast<int>(i % 7 + 1))
                                         : pattern(root, i);
      if (buf_[i] != want) {
        if (first < 0) first = static_cast<int64_t>(i);
        ++bad;
      }
    }
    if (bad > 0)
      std::cerr << "collective_bench: MISMATCH on rank " << m_.rank() << ": " << algo_name(a) << " of "
                << size_name(bytes) << ": " << bad << " wrong elements, the first at " << first << " ("
                << buf_[static_cast<std::size_t>(first)] << ")\n";
    std::vector<float> sums(static_cast<std::size_t>(nr) + 1, 0.0f);  // the count, then each member's time
    sums[0] = static_cast<float>(bad > 0);
    sums[static_cast<std::size_t>(m_.rank()) + 1] = static_cast<float>(seconds * 1e3);
    m_.allreduce(sums.data(), static_cast<int64_t>(sums.size()));
    if (sums[0] != 0)
      throw std::runtime_error("wrong result on " + std::to_string(static_cast<int>(sums[0])) + " member(s): " +
                               algo_name(a) + " of " + size_name(bytes));
    return *std::max_element(sums.begin() + 1, sums.end()) / 1e3;
  }

  /// The median time of a bare barrier on rank 0, after a barrier.
  double barrier_time(int iters) {
    std::vector<double> t;
    for (int k = 0; k < std::max(iters, 5); ++k) {
      m_.barrier();
      const auto t0 = clock_type::now();
      m_.barrier();
      t.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
    }
    return median(t);
  }

  /// Rank 0 picks the iteration count from its warm-up time; an allreduce tells the others.
  int agree_iterations(double warm) {
    float iters = 0;
    if (m_.rank() == 0) {
      const double want = warm > 0 ? c_.target_s / warm : c_.max_iters;
      iters = static_cast<float>(std::clamp(static_cast<int>(want), c_.min_iters, c_.max_iters));
    }
    m_.allreduce(&iters, 1);
    return static_cast<int>(iters);
  }

  /// The core ran what the threshold forces.
  void check_algorithm(algo a, collective_algorithm ran) const {
    collective_algorithm want = collective_algorithm::none;
    if (m_.size() > 1) switch (a) {
        case algo::ring: want = collective_algorithm::ring; break;
        case algo::doubling: want = collective_algorithm::recursive_doubling; break;
        case algo::broadcast: want = collective_algorithm::chain; break;
        case algo::tree: want = collective_algorithm::binomial_tree; break;
      }
    if (ran != want) throw std::runtime_error(std::string(algo_name(a)) + " ran " + to_string(ran));
  }

  const config& c_;
  member& m_;
  std::vector<float> buf_;
};

void print_row(const config& c, int n, const row& r) {
  const double bus = is_allreduce(r.a) ? 2.0 * (n - 1) / n : 1.0;
  const double algbw = static_cast<double>(r.bytes) / r.med_s / 1e6;
  std::cout << std::fixed << "| " << c.label << " | " << n << " | " << algo_name(r.a) << " | " << r.piece << " | "
            << size_name(r.bytes) << " | " << r.iters << " | " << std::setprecision(3) << r.med_s * 1e3 << " | "
            << r.min_s * 1e3 << " | " << r.max_s * 1e3 << " | " << std::setprecision(1) << algbw << " | "
            << algbw * bus << " |" << std::endl;
}

config parse(int argc, char** argv) {
  config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--rank") {
      c.rank = std::stoi(value());
    } else if (a == "--nodes") {
      int k = 0;
      for (const std::string& hp : split(value(), ',')) {
        const auto colon = hp.rfind(':');
        if (colon == std::string::npos) throw std::runtime_error("--nodes: '" + hp + "' is not HOST:PORT");
        c.nodes.push_back({"node" + std::to_string(k++), hp.substr(0, colon),
                           static_cast<uint16_t>(std::stoi(hp.substr(colon + 1)))});
      }
    } else if (a == "--secret-file") {
      c.secret_file = value();
    } else if (a == "--label") {
      c.label = value();
    } else if (a == "--sizes") {
      c.sizes.clear();
      for (const std::string& s : split(value(), ',')) c.sizes.push_back(parse_size(s));
    } else if (a == "--algorithms") {
      c.algorithms.clear();
      for (const std::string& s : split(value(), ',')) c.algorithms.push_back(parse_algo(s));
    } else if (a == "--piece") {
      c.piece = std::stoll(value());
    } else if (a == "--pieces") {
      c.pieces.clear();
      for (const std::string& s : split(value(), ',')) c.pieces.push_back(std::stoll(s));
    } else if (a == "--piece-size") {
      c.piece_size = parse_size(value());
    } else if (a == "--warmup") {
      c.warmup = std::stoi(value());
    } else if (a == "--min-iters") {
      c.min_iters = std::stoi(value());
    } else if (a == "--max-iters") {
      c.max_iters = std::stoi(value());
    } else if (a == "--corrupt") {
      c.corrupt = std::stoi(value());
    } else if (a == "--target-s") {
      c.target_s = std::stod(value());
    } else if (a == "--lane-mb") {
      c.lane_bytes = std::stoull(value()) << 20;
    } else {
      throw std::runtime_error("unknown option " + a);
    }
  }
  if (c.sizes.empty())
    for (std::size_t s = 4 << 10; s <= (std::size_t(64) << 20); s *= (s < (std::size_t(4) << 20) ? 2 : 4))
      c.sizes.push_back(s);
  if (c.nodes.empty() || c.rank < 0 || c.rank >= static_cast<int>(c.nodes.size()) || c.secret_file.empty())
    throw std::runtime_error("needs --rank R (0 <= R < N), --nodes HOST:PORT,... (N of them) and --secret-file FILE");
  if (c.warmup < 1 || c.min_iters < 1 || c.max_iters < c.min_iters || c.piece < 1)
    throw std::runtime_error("--warmup, --min-iters and --piece must be >= 1, --max-iters >= --min-iters");
  return c;
}

} // namespace

int main(int argc, char** argv) {
  config c;
  try {
    c = parse(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "collective_bench: " << e.what() << "\n"
              << "usage: troupe_collective_bench --rank R --nodes HOST:PORT,... --secret-file FILE [--label NAME]\n"
                 "  [--sizes 4K,...,64M] [--algorithms ring,doubling,broadcast,tree] [--piece 65536]\n"
                 "  [--pieces 16384,65536,262144 --piece-size 16M] [--warmup 1] [--min-iters 3] [--max-iters 20]\n"
                 "  [--target-s 3] [--corrupt R] [--lane-mb 64]\n";
    return 2;
  }
  try {
    member m(c);
    m.start();
    m.configure({});
    m.barrier();
    sweep s(c, m);
    const int n = m.size();
    for (algo a : c.algorithms)
      for (std::size_t bytes : c.sizes) {
        const row r = s.measure(a, c.piece, bytes);
        if (c.rank == 0) print_row(c, n, r);
      }
    for (algo a : {algo::ring, algo::broadcast})
      for (int64_t piece : c.pieces) {
        const row r = s.measure(a, piece, c.piece_size);
        if (c.rank == 0) print_row(c, n, r);
      }
    m.configure({});
    m.barrier();
    m.stop();
  } catch (const std::exception& e) {
    std::cerr << "collective_bench: rank " << c.rank << ": " << e.what() << "\n";
    return 1;
  }
  return 0;
}
