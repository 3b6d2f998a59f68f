#pragma once

// What a node's log says about the connections, handshakes and frames its
// transport rejects (net/transport.hpp): the first rejection of each reason
// from each address in full, then at most one line per address and interval
// with the counts, so that a flood cannot flood the log and a node with the
// wrong secret is still seen after the first stray connection. The counts by
// reason go into the run's metrics. Thread-safe; the clock is the caller's.

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "net/transport.hpp"

namespace troupe::net {

class rejection_log {
public:
  using clock = std::chrono::steady_clock;
  explicit rejection_log(std::chrono::milliseconds interval = std::chrono::seconds(10)) : interval_(interval) {}

  /// Counts `r` seen at `now`; returns the lines to log now (often none).
  std::vector<std::string> add(const rejection& r, clock::time_point now);
  /// The counted rejections not yet logged, one line per address (at the end of a run).
  std::vector<std::string> flush();
  /// Rejections by reason since the start, every address.
  std::map<std::string, uint64_t> totals() const;

private:
  struct source {
    std::set<std::string> reasons_logged;
    std::map<std::string, uint64_t> unlogged;  // by reason, since the last line
    clock::time_point last_line{};
  };
  static std::string summary(const std::string& address, std::map<std::string, uint64_t>& unlogged);

  std::chrono::milliseconds interval_;
  mutable std::mutex mutex_;
  std::map<std::string, source> sources_;  // by address (without the port)
  std::map<std::string, uint64_t> totals_;
};

/// "127.0.0.1:4711" -> "127.0.0.1", "[::1]:4711" -> "[::1]"; "" -> "unknown address".
std::string host_of(const std::string& remote);

} // namespace troupe::net
