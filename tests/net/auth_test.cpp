#include <catch2/catch.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "net/auth.hpp"
#include "tests/test_util.hpp"

using namespace troupe;
using namespace troupe::net;
using Catch::Matchers::Contains;
using Catch::Matchers::Equals;
using troupe::testing::message;
using troupe::testing::temp_dir;

namespace {

auth_identity identity(uint32_t node, const std::string& secret = "s3cret", const std::string& job = "job-1",
                       uint16_t schema = 2) {
  auth_identity me;
  me.secret = secret;
  me.job = job_digest(job);
  me.schema = schema;
  me.node = node;
  return me;
}

session_info session(uint64_t id) { return {100 + id, id, 0, 0}; }

std::string hex(const digest& d) {
  std::string s;
  char buf[3];
  for (uint8_t b : d) {
    std::snprintf(buf, sizeof buf, "%02x", b);
    s += buf;
  }
  return s;
}

auth_error failure_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const auth_failure& e) {
    return e.reason();
  }
  FAIL("no auth_failure");
  return auth_error::malformed;
}

void write_file(const std::string& path, const std::string& text, mode_t mode) {
  std::ofstream(path, std::ios::binary) << text;
  REQUIRE(::chmod(path.c_str(), mode) == 0);
}

} // namespace

TEST_CASE("auth: HMAC-SHA256 matches RFC 4231, digests and ids", "[net][auth]") {
  const std::string data = "what do ya want for nothing?";
  CHECK(hex(hmac_sha256("Jefe", data.data(), data.size())) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(hex(job_digest("abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(equal_constant_time("abcd", "abcd", 4));
  CHECK_FALSE(equal_constant_time("abcd", "abce", 4));
  CHECK(random_id() != random_id());
}

TEST_CASE("auth: the right secret authenticates both sides and exchanges their sessions", "[net][auth]") {
  acceptor_handshake b(identity(0), 3);
  dialer_handshake a(identity(2), 0, session(7));
  b.on_hello(a.hello());
  CHECK(b.claimed_node() == 2);
  const auto challenge = b.challenge(session(9));
  const auto proof = a.on_challenge(challenge);
  b.on_proof(proof);
  CHECK(a.peer_session().session == 9);
  CHECK(a.peer_session().incarnation == 109);
  CHECK(b.peer_session().session == 7);

  // Fresh nonces: two hellos of one node differ.
  dialer_handshake a2(identity(2), 0, session(7));
  CHECK(a2.hello() != a.hello());
}

TEST_CASE("auth: a wrong secret is refused on either side", "[net][auth]") {
  SECTION("the dialer finds the acceptor's challenge wrong") {
    acceptor_handshake b(identity(0, "other"), 2);
    dialer_handshake a(identity(1), 0, session(1));
    b.on_hello(a.hello());
    CHECK(failure_of([&] { a.on_challenge(b.challenge(session(2))); }) == auth_error::bad_mac);
  }
  SECTION("the acceptor finds the dialer's proof wrong") {
    acceptor_handshake b(identity(0), 2);
    dialer_handshake a(identity(1), 0, session(1));
    b.on_hello(a.hello());
    const auto challenge = b.challenge(session(2));
    // A dialer without the secret cannot make the proof: any other bytes fail.
    std::vector<std::byte> forged(mac_bytes, std::byte{0x5a});
    CHECK(failure_of([&] { b.on_proof(forged); }) == auth_error::bad_mac);
    auto proof = a.on_challenge(challenge);
    proof[3] ^= std::byte{1};
    CHECK(failure_of([&] { b.on_proof(proof); }) == auth_error::bad_mac);
  }
  SECTION("a proof before the challenge, a proof of another handshake") {
    acceptor_handshake b(identity(0), 2), b2(identity(0), 2);
    dialer_handshake a(identity(1), 0, session(1));
    CHECK(failure_of([&] { b.on_proof(std::vector<std::byte>(mac_bytes)); }) == auth_error::malformed);
    b.on_hello(a.hello());
    b2.on_hello(a.hello());
    const auto proof = a.on_challenge(b.challenge(session(2)));
    (void)b2.challenge(session(2));
    CHECK(failure_of([&] { b2.on_proof(proof); }) == auth_error::bad_mac);  // b2's nonce differs: no replay
  }
  SECTION("fields changed on the way break the MAC") {
    acceptor_handshake b(identity(0), 2);
    dialer_handshake a(identity(1), 0, session(1));
    b.on_hello(a.hello());
    auto challenge = b.challenge(session(2));
    challenge[60] ^= std::byte{1};  // in the nonce
    CHECK(failure_of([&] { a.on_challenge(challenge); }) == auth_error::bad_mac);
  }
}

TEST_CASE("auth: no secret, another job, another schema, a node it cannot be", "[net][auth]") {
  CHECK_THROWS_MATCHES(dialer_handshake(identity(1, ""), 0, session(1)), error, message(Contains("shared secret")));
  CHECK_THROWS_MATCHES(acceptor_handshake(identity(0, ""), 2), error, message(Contains("shared secret")));
  {
    acceptor_handshake b(identity(0, "s3cret", "job-1"), 2);
    dialer_handshake a(identity(1, "s3cret", "job-2"), 0, session(1));
    try {
      b.on_hello(a.hello());
      FAIL("another job accepted");
    } catch (const auth_failure& e) {
      CHECK(e.reason() == auth_error::wrong_job);
      CHECK_THAT(e.what(), Contains("another job"));
    }
  }
  {
    acceptor_handshake b(identity(0, "s3cret", "job-1", 2), 2);
    dialer_handshake a(identity(1, "s3cret", "job-1", 3), 0, session(1));
    CHECK(failure_of([&] { b.on_hello(a.hello()); }) == auth_error::wrong_schema);
  }
  {  // the dialer checks the acceptor too
    acceptor_handshake b(identity(0, "s3cret", "job-1"), 2);
    dialer_handshake a(identity(1, "s3cret", "job-1"), 0, session(1));
    b.on_hello(a.hello());
    acceptor_handshake other(identity(0, "s3cret", "job-2"), 2);
    auto bad = a.hello();
    // Make `other` accept the hello of job-1 by asking it with a job-2 dialer instead.
    dialer_handshake a2(identity(1, "s3cret", "job-2"), 0, session(1));
    other.on_hello(a2.hello());
    CHECK(failure_of([&] { a.on_challenge(other.challenge(session(2))); }) == auth_error::wrong_job);
    (void)bad;
  }
  {  // nodes dial smaller indices: 0 cannot dial 1, 1 cannot claim to be 1, 5 is not in a run of 3
    acceptor_handshake b(identity(1), 3);
    CHECK(failure_of([&] { b.on_hello(dialer_handshake(identity(0), 1, session(1)).hello()); }) ==
          auth_error::wrong_node);
    CHECK(failure_of([&] { b.on_hello(dialer_handshake(identity(1), 1, session(1)).hello()); }) ==
          auth_error::wrong_node);
    CHECK(failure_of([&] { b.on_hello(dialer_handshake(identity(5), 1, session(1)).hello()); }) ==
          auth_error::wrong_node);
  }
  {  // the node dialed must answer as itself
    acceptor_handshake b(identity(1), 3);
    dialer_handshake a(identity(2), 0, session(1));
    b.on_hello(a.hello());
    CHECK(failure_of([&] { a.on_challenge(b.challenge(session(2))); }) == auth_error::wrong_node);
  }
}

TEST_CASE("auth: malformed bodies are refused", "[net][auth]") {
  acceptor_handshake b(identity(0), 2);
  dialer_handshake a(identity(1), 0, session(1));
  auto hello = a.hello();
  CHECK(failure_of([&] { b.on_hello({}); }) == auth_error::malformed);
  CHECK(failure_of([&] { b.on_hello(std::vector<std::byte>(hello.begin(), hello.end() - 1)); }) ==
        auth_error::malformed);
  auto reserved = hello;
  reserved[2] = std::byte{1};
  CHECK(failure_of([&] { b.on_hello(reserved); }) == auth_error::malformed);
  b.on_hello(hello);
  auto challenge = b.challenge(session(2));
  CHECK(failure_of([&] { a.on_challenge(std::vector<std::byte>(challenge.begin(), challenge.end() - 1)); }) ==
        auth_error::malformed);
  CHECK(failure_of([&] { b.on_proof(std::vector<std::byte>(31)); }) == auth_error::malformed);
}

TEST_CASE("auth: secret files must be the owner's alone, present and not empty", "[net][auth]") {
  temp_dir dir;
  const std::string good = dir.file("secret");
  write_file(good, "abc123-0123456789\n", 0600);
  CHECK(read_secret_file(good) == "abc123-0123456789");
  write_file(good, "abc123-0123456789", 0400);
  CHECK(read_secret_file(good) == "abc123-0123456789");

  const std::string open = dir.file("open");
  write_file(open, "abc123\n", 0644);
  CHECK_THROWS_MATCHES(read_secret_file(open), error,
                       message(Equals("permissions 0644 for '" + open + "' are too open; chmod 600 " + open)));
  write_file(open, "abc123\n", 0640);
  CHECK_THROWS_MATCHES(read_secret_file(open), error, message(Contains("0640") && Contains("too open")));
  write_file(open, "abc123\n", 0604);
  CHECK_THROWS_MATCHES(read_secret_file(open), error, message(Contains("too open")));

  CHECK_THROWS_MATCHES(read_secret_file(dir.file("missing")), error,
                       message(Contains("missing") && Contains("chmod 600")));
  const std::string empty = dir.file("empty");
  write_file(empty, "\n", 0600);
  CHECK_THROWS_MATCHES(read_secret_file(empty), error, message(Contains("empty")));
  CHECK_THROWS_MATCHES(read_secret_file(dir.path()), error, message(Contains("not a regular file")));
}

TEST_CASE("auth: a secret file must hold at least 16 bytes and belong to the user running the node", "[net][auth]") {
  temp_dir dir;
  const std::string path = dir.file("secret");
  write_file(path, "x\n", 0600);
  CHECK_THROWS_MATCHES(read_secret_file(path), error,
                       message(Contains("holds 1 bytes") && Contains("at least 16") && Contains("openssl rand")));
  write_file(path, std::string(15, 'k'), 0600);
  CHECK_THROWS_MATCHES(read_secret_file(path), error, message(Contains("holds 15 bytes")));
  write_file(path, std::string(16, 'k'), 0600);
  CHECK(read_secret_file(path) == std::string(16, 'k'));
  // Another user's file, however private: refused (only root can hand a file to another user).
  if (::geteuid() == 0) {
    REQUIRE(::chown(path.c_str(), 4242, 4242) == 0);
    CHECK_THROWS_MATCHES(read_secret_file(path), error,
                         message(Contains("belongs to user 4242") && Contains("not to the user running")));
  } else {
    WARN("not root: the owner check is not exercised (chown needs root)");
  }
}

TEST_CASE("auth: both sides derive the same frame keys, one per direction, new for every link", "[net][auth]") {
  auto link = [](const std::string& secret_b) {
    dialer_handshake a(identity(1), 0, session(1));
    acceptor_handshake b(identity(0, secret_b), 3);
    b.on_hello(a.hello());
    auto proof = a.on_challenge(b.challenge(session(2)));
    b.on_proof(proof);
    return std::make_pair(a.keys(), b.keys());
  };
  auto [a, b] = link("s3cret");
  CHECK(a.send == b.receive);
  CHECK(a.receive == b.send);
  CHECK(a.send != a.receive);
  CHECK(a.send != frame_key{});
  auto [a2, b2] = link("s3cret");
  CHECK(a2.send != a.send);  // fresh nonces: fresh keys
  CHECK(a2.send == b2.receive);
}
