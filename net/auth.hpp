#pragma once

// Authentication of a link (docs/protocol.md, "Between nodes: the handshake"): a mutual
// HMAC-SHA256 challenge-response over a shared secret, before any other frame.
//
//   dialer   -> hello     {schema, job digest, node_a, nonce_a, session_a}
//   acceptor -> challenge {schema, job digest, node_b, nonce_b, session_b,
//                          HMAC(secret, "troupe challenge" | nonce_a | nonce_b | node_b | hello | challenge fields)}
//   dialer   -> proof     {HMAC(secret, "troupe proof" | nonce_b | nonce_a | node_a | hello | challenge)}
//
// Both sides then derive the link's frame keys (one per direction) by
// HKDF-SHA256 from the secret, both nonces, both nodes and the transcript
// (net/frame_cipher.hpp protects every later frame with them).
//
// Nonces are fresh from RAND_bytes; MACs are compared in constant time. A
// wrong schema, job or node, a bad MAC or a malformed body is an auth_failure.
// These classes are the pure logic; net::transport moves their bodies.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "net/frame_cipher.hpp"
#include "tensor/error.hpp"

namespace troupe::net {

constexpr std::size_t nonce_bytes = 32, mac_bytes = 32, digest_bytes = 32;
using digest = std::array<uint8_t, digest_bytes>;

/// Why a handshake failed.
enum class auth_error : uint8_t {
  malformed,     ///< a body of the wrong size or with reserved bytes set
  wrong_schema,  ///< the peer speaks another schema version
  wrong_job,     ///< the peer runs another job (job digest differs)
  wrong_node,    ///< the peer claims a node it cannot be (out of range, itself, or not the node dialed)
  bad_mac,       ///< the peer does not know the shared secret
  refused,       ///< the peer refused us (it sent why)
  timeout,       ///< the handshake did not finish in time
};
constexpr int auth_errors = 7;
const char* to_string(auth_error e);

class auth_failure : public error {
public:
  auth_failure(auth_error r, const std::string& what) : error(what), reason_(r) {}
  auth_error reason() const { return reason_; }

private:
  auth_error reason_;
};

/// What a side says about its session with the peer, so that both decide
/// alike whether a new link resumes the session (net::transport).
struct session_info {
  uint64_t incarnation = 0;   ///< random per transport instance: a restarted node has a new one
  uint64_t session = 0;       ///< this side's id of its session with the peer (new after each reset)
  uint64_t peer_session = 0;  ///< the peer's session id this side remembers (0: none)
  uint64_t delivered = 0;     ///< last sequence number of the peer's messages delivered here in it
};

/// Who this side is.
struct auth_identity {
  std::string secret;     ///< the shared secret (read_secret_file)
  digest job{};           ///< job_digest() of the job's hash
  uint16_t schema = 0;    ///< wire::SCHEMA_VERSION
  uint32_t node = 0;      ///< this node's index
};

/// The dialer's side of the handshake.
class dialer_handshake {
public:
  /// Dials node `peer` (which must answer as that node). Throws error for an empty secret.
  dialer_handshake(auth_identity me, uint32_t peer, const session_info& mine);
  /// The hello frame's body.
  const std::vector<std::byte>& hello() const { return hello_; }
  /// Checks the acceptor's challenge; returns the proof frame's body. Throws auth_failure.
  std::vector<std::byte> on_challenge(const std::vector<std::byte>& body);
  /// The acceptor's session info (valid after on_challenge).
  const session_info& peer_session() const { return peer_session_; }
  /// This link's frame keys (valid after on_challenge).
  const link_keys& keys() const { return keys_; }

private:
  auth_identity me_;
  link_keys keys_;
  uint32_t peer_;
  std::array<uint8_t, nonce_bytes> nonce_{};
  std::vector<std::byte> hello_;
  session_info peer_session_;
};

/// The acceptor's side of the handshake.
class acceptor_handshake {
public:
  /// Accepts dialers with indices in (me.node, nodes). Throws error for an empty secret.
  acceptor_handshake(auth_identity me, uint32_t nodes);
  /// Checks a hello (schema, job, node range). Throws auth_failure.
  void on_hello(const std::vector<std::byte>& body);
  /// The challenge frame's body, carrying `mine`: this side's session info
  /// for claimed_node().
  std::vector<std::byte> challenge(const session_info& mine);
  /// The node the hello claims (authenticated only after on_proof).
  uint32_t claimed_node() const { return peer_node_; }
  /// The node a readable hello named, whether or not on_hello accepted it
  /// (-1: none yet): for the log of a refusal, never authenticated.
  int64_t named_node() const { return claimed_; }
  /// Checks the proof. Throws auth_failure.
  void on_proof(const std::vector<std::byte>& body);
  /// The dialer's session info (authenticated after on_proof).
  const session_info& peer_session() const { return peer_session_; }
  /// This link's frame keys (valid after on_proof).
  const link_keys& keys() const { return keys_; }

private:
  auth_identity me_;
  link_keys keys_;
  uint32_t nodes_;
  std::array<uint8_t, nonce_bytes> nonce_{}, peer_nonce_{};
  std::vector<std::byte> hello_, challenge_;
  uint32_t peer_node_ = 0;
  int64_t claimed_ = -1;
  session_info peer_session_;
};

/// SHA-256 of a job's hash string: what hello and challenge carry.
digest job_digest(const std::string& job_hash);
/// HMAC-SHA256 of `data` under `key`.
digest hmac_sha256(const std::string& key, const void* data, std::size_t bytes);
/// Compares in time independent of where the bytes differ.
bool equal_constant_time(const void* a, const void* b, std::size_t bytes);
/// Cryptographically random bytes (RAND_bytes); throws error when none can be had.
void random_bytes(void* out, std::size_t bytes);
/// A random nonzero 64-bit value.
uint64_t random_id();

/// The fewest bytes a shared secret may have.
constexpr std::size_t min_secret_bytes = 16;

/// Reads a shared secret file (one trailing newline dropped). Refuses, like
/// ssh, a file that group or others may access ("permissions 0644 for 'x' are
/// too open; chmod 600 x") or that another user owns, and a missing,
/// non-regular or short (under min_secret_bytes) file.
std::string read_secret_file(const std::string& path);

} // namespace troupe::net
