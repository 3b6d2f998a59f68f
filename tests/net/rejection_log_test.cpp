#include <catch2/catch.hpp>

#include "net/rejection_log.hpp"

using namespace troupe::net;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;

namespace {

rejection refused(const std::string& remote, const std::string& reason) {
  rejection r;
  r.remote = remote;
  r.reason = reason;
  r.what = "connection from " + remote + ": " + reason;
  return r;
}

} // namespace

TEST_CASE("rejection log: each reason from each address in full once, then counts at most once per interval",
          "[net][rejection_log]") {
  rejection_log log(10s);
  const auto t0 = rejection_log::clock::now();
  // One stray connection, then a node with the wrong secret from the same address: both are seen.
  auto lines = log.add(refused("127.0.0.1:5000", "timeout"), t0);
  REQUIRE(lines.size() == 1);
  CHECK_THAT(lines[0], Contains("refused: connection from 127.0.0.1:5000: timeout"));
  lines = log.add(refused("127.0.0.1:5001", "bad_mac"), t0 + 1s);
  REQUIRE(lines.size() == 1);
  CHECK_THAT(lines[0], Contains("bad_mac"));
  // A flood: silent until the interval has passed, then one line with the counts by reason.
  for (int i = 0; i < 500; ++i) CHECK(log.add(refused("127.0.0.1:6000", "bad_mac"), t0 + 2s).empty());
  for (int i = 0; i < 3; ++i) CHECK(log.add(refused("127.0.0.1:6001", "timeout"), t0 + 3s).empty());
  lines = log.add(refused("127.0.0.1:6002", "bad_mac"), t0 + 10s);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0] == "refused 504 more from 127.0.0.1 (bad_mac 501, timeout 3) in the last 10 s");
  // Another address has its own first line.
  lines = log.add(refused("10.0.0.9:1", "bad_mac"), t0 + 10s);
  REQUIRE(lines.size() == 1);
  CHECK_THAT(lines[0], Contains("10.0.0.9"));
  // What is left unlogged comes out at the end; the totals count everything.
  CHECK(log.add(refused("127.0.0.1:7000", "unknown_address"), t0 + 11s).size() == 1);
  CHECK(log.add(refused("127.0.0.1:7000", "unknown_address"), t0 + 12s).empty());
  lines = log.flush();
  REQUIRE(lines.size() == 1);
  CHECK(lines[0] == "refused 1 more from 127.0.0.1 (unknown_address 1)");
  CHECK(log.flush().empty());
  auto totals = log.totals();
  CHECK(totals["bad_mac"] == 503);
  CHECK(totals["timeout"] == 4);
  CHECK(totals["unknown_address"] == 2);
}

TEST_CASE("rejection log: addresses without a port, IPv6 and unknown", "[net][rejection_log]") {
  CHECK(host_of("127.0.0.1:80") == "127.0.0.1");
  CHECK(host_of("[::1]:80") == "[::1]");
  CHECK(host_of("") == "unknown address");
  CHECK(host_of("node-a") == "node-a");
}
