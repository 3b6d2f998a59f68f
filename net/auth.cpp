#include "net/auth.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/core_names.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

namespace troupe::net {

namespace {

constexpr std::size_t hello_bytes = 2 + 2 + 4 + digest_bytes + nonce_bytes + 4 * 8;
constexpr std::size_t challenge_bytes = hello_bytes + mac_bytes;
constexpr std::size_t proof_bytes = mac_bytes;

class writer {
public:
  explicit writer(std::vector<std::byte>& out) : out_(out) {}
  template <typename T>
  void put(T v) {
    for (std::size_t i = 0; i < sizeof(T); ++i) out_.push_back(static_cast<std::byte>((uint64_t(v) >> (8 * i)) & 0xff));
  }
  void put(const void* p, std::size_t n) {
    auto* b = static_cast<const std::byte*>(p);
    out_.insert(out_.end(), b, b + n);
  }

private:
  std::vector<std::byte>& out_;
};

class reader {
public:
  explicit reader(const std::vector<std::byte>& in) : in_(in) {}
  template <typename T>
  T get() {
    uint64_t v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) v |= uint64_t(in_[at_ + i]) << (8 * i);
    at_ += sizeof(T);
    return static_cast<T>(v);
  }
  void get(void* p, std::size_t n) {
    std::memcpy(p, in_.data() + at_, n);
    at_ += n;
  }

private:
  const std::vector<std::byte>& in_;
  std::size_t at_ = 0;
};

// The fields hello and challenge share: schema, node, job digest, nonce, session.
struct greeting {
  uint16_t schema = 0;
  uint32_t node = 0;
  digest job{};
  std::array<uint8_t, nonce_bytes> nonce{};
  session_info session;
};

void write_greeting(std::vector<std::byte>& out, const greeting& g) {
  writer w(out);
  w.put<uint16_t>(g.schema);
  w.put<uint16_t>(0);
  w.put<uint32_t>(g.node);
  w.put(g.job.data(), g.job.size());
  w.put(g.nonce.data(), g.nonce.size());
  w.put<uint64_t>(g.session.incarnation);
  w.put<uint64_t>(g.session.session);
  w.put<uint64_t>(g.session.peer_session);
  w.put<uint64_t>(g.session.delivered);
}

greeting read_greeting(const std::vector<std::byte>& in, std::size_t expected, const char* what) {
  if (in.size() != expected)
    throw auth_failure(auth_error::malformed, std::string(what) + " of " + std::to_string(in.size()) +
                                                  " bytes, expected " + std::to_string(expected));
  reader r(in);
  greeting g;
  g.schema = r.get<uint16_t>();
  if (r.get<uint16_t>() != 0) throw auth_failure(auth_error::malformed, std::string(what) + " with reserved bytes set");
  g.node = r.get<uint32_t>();
  r.get(g.job.data(), g.job.size());
  r.get(g.nonce.data(), g.nonce.size());
  g.session.incarnation = r.get<uint64_t>();
  g.session.session = r.get<uint64_t>();
  g.session.peer_session = r.get<uint64_t>();
  g.session.delivered = r.get<uint64_t>();
  return g;
}

void check_peer(const greeting& g, const auth_identity& me, const char* what) {
  if (g.schema != me.schema)
    throw auth_failure(auth_error::wrong_schema,
                       std::string(what) + " speaks schema version " + std::to_string(g.schema) + ", this node " +
                           std::to_string(me.schema) + ": run the same troupe version on every node");
  if (!equal_constant_time(g.job.data(), me.job.data(), digest_bytes))
    throw auth_failure(auth_error::wrong_job, std::string(what) +
                                                  " runs another job (its job hash differs): every node must "
                                                  "read the same job file");
}

// HMAC over a label, two nonces, a node index and the transcript so far.
digest transcript_mac(const std::string& secret, const char* label, const std::array<uint8_t, nonce_bytes>& first,
                      const std::array<uint8_t, nonce_bytes>& second, uint32_t node,
                      const std::vector<std::byte>& transcript) {
  std::vector<std::byte> data;
  writer w(data);
  w.put(label, std::strlen(label));
  w.put(first.data(), first.size());
  w.put(second.data(), second.size());
  w.put<uint32_t>(node);
  w.put(transcript.data(), transcript.size());
  return hmac_sha256(secret, data.data(), data.size());
}

// HKDF-SHA256 (RFC 5869): the secret as input key material, both nonces as
// salt, both nodes and the transcript's digest as info; 64 bytes, the first
// half for the dialer's frames, the second for the acceptor's.
link_keys derive_keys(const std::string& secret, const std::array<uint8_t, nonce_bytes>& dialer_nonce,
                      const std::array<uint8_t, nonce_bytes>& acceptor_nonce, uint32_t dialer_node,
                      uint32_t acceptor_node, const std::vector<std::byte>& transcript, bool for_dialer) {
  std::vector<unsigned char> salt(dialer_nonce.begin(), dialer_nonce.end());
  salt.insert(salt.end(), acceptor_nonce.begin(), acceptor_nonce.end());
  std::vector<std::byte> info_bytes;
  writer w(info_bytes);
  const char label[] = "troupe link keys v2";
  w.put(label, sizeof label - 1);
  w.put<uint32_t>(dialer_node);
  w.put<uint32_t>(acceptor_node);
  const digest t = job_digest(std::string(reinterpret_cast<const char*>(transcript.data()), transcript.size()));
  w.put(t.data(), t.size());
  std::array<unsigned char, 2 * frame_key_bytes> out{};
  EVP_KDF* kdf = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
  EVP_KDF_CTX* ctx = kdf ? EVP_KDF_CTX_new(kdf) : nullptr;
  EVP_KDF_free(kdf);
  if (!ctx) throw error("link keys: OpenSSL has no HKDF");
  char md[] = "SHA256";
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, md, 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, const_cast<char*>(secret.data()), secret.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, salt.data(), salt.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, info_bytes.data(), info_bytes.size()),
      OSSL_PARAM_construct_end()};
  const int ok = EVP_KDF_derive(ctx, out.data(), out.size(), params);
  EVP_KDF_CTX_free(ctx);
  if (ok != 1) throw error("link keys: HKDF failed (OpenSSL)");
  link_keys k;
  std::memcpy(for_dialer ? k.send.data() : k.receive.data(), out.data(), frame_key_bytes);
  std::memcpy(for_dialer ? k.receive.data() : k.send.data(), out.data() + frame_key_bytes, frame_key_bytes);
  return k;
}

void require_secret(const auth_identity& me) {
  if (me.secret.empty()) throw error("authentication needs a shared secret: none was given (read_secret_file)");
}

std::string octal(unsigned mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", mode & 07777);
  return buf;
}

} // namespace

const char* to_string(auth_error e) {
  switch (e) {
    case auth_error::malformed: return "malformed";
    case auth_error::wrong_schema: return "wrong_schema";
    case auth_error::wrong_job: return "wrong_job";
    case auth_error::wrong_node: return "wrong_node";
    case auth_error::bad_mac: return "bad_mac";
    case auth_error::refused: return "refused";
    case auth_error::timeout: return "timeout";
  }
  return "unknown";
}

dialer_handshake::dialer_handshake(auth_identity me, uint32_t peer, const session_info& mine)
    : me_(std::move(me)), peer_(peer) {
  require_secret(me_);
  random_bytes(nonce_.data(), nonce_.size());
  greeting g;
  g.schema = me_.schema;
  g.node = me_.node;
  g.job = me_.job;
  g.nonce = nonce_;
  g.session = mine;
  write_greeting(hello_, g);
}

std::vector<std::byte> dialer_handshake::on_challenge(const std::vector<std::byte>& body) {
  const std::string who = "node " + std::to_string(peer_);
  if (body.size() != challenge_bytes)
    throw auth_failure(auth_error::malformed, who + ": challenge of " + std::to_string(body.size()) +
                                                  " bytes, expected " + std::to_string(challenge_bytes));
  std::vector<std::byte> fields(body.begin(), body.end() - mac_bytes);
  greeting g = read_greeting(fields, hello_bytes, "challenge");
  check_peer(g, me_, who.c_str());
  if (g.node != peer_)
    throw auth_failure(auth_error::wrong_node, who + " answered as node " + std::to_string(g.node) +
                                                   ": check the node list (host and port of each node)");
  std::vector<std::byte> transcript = hello_;
  transcript.insert(transcript.end(), fields.begin(), fields.end());
  const digest expected = transcript_mac(me_.secret, "troupe challenge", nonce_, g.nonce, g.node, transcript);
  if (!equal_constant_time(expected.data(), body.data() + fields.size(), mac_bytes))
    throw auth_failure(auth_error::bad_mac, who + " failed authentication: its challenge does not match the "
                                                  "shared secret (is the secret file the same on every node?)");
  peer_session_ = g.session;
  transcript.insert(transcript.end(), body.end() - mac_bytes, body.end());
  keys_ = derive_keys(me_.secret, nonce_, g.nonce, me_.node, g.node, transcript, true);
  const digest proof = transcript_mac(me_.secret, "troupe proof", g.nonce, nonce_, me_.node, transcript);
  std::vector<std::byte> out(proof_bytes);
  std::memcpy(out.data(), proof.data(), proof_bytes);
  return out;
}

acceptor_handshake::acceptor_handshake(auth_identity me, uint32_t nodes) : me_(std::move(me)), nodes_(nodes) {
  require_secret(me_);
  random_bytes(nonce_.data(), nonce_.size());
}

void acceptor_handshake::on_hello(const std::vector<std::byte>& body) {
  greeting g = read_greeting(body, hello_bytes, "hello");
  claimed_ = g.node;  // named in a refusal, unauthenticated
  const std::string who = "node " + std::to_string(g.node) + " (claimed)";
  check_peer(g, me_, who.c_str());
  if (g.node <= me_.node || g.node >= nodes_)
    throw auth_failure(auth_error::wrong_node,
                       "a hello from node " + std::to_string(g.node) + ": node " + std::to_string(me_.node) +
                           " accepts only nodes " + std::to_string(me_.node + 1) + ".." + std::to_string(nodes_ - 1) +
                           " (a node dials the nodes of smaller index)");
  peer_node_ = g.node;
  peer_nonce_ = g.nonce;
  peer_session_ = g.session;
  hello_ = body;
}

std::vector<std::byte> acceptor_handshake::challenge(const session_info& mine) {
  greeting g;
  g.schema = me_.schema;
  g.node = me_.node;
  g.job = me_.job;
  g.nonce = nonce_;
  g.session = mine;
  std::vector<std::byte> fields;
  write_greeting(fields, g);
  std::vector<std::byte> transcript = hello_;
  transcript.insert(transcript.end(), fields.begin(), fields.end());
  const digest mac = transcript_mac(me_.secret, "troupe challenge", peer_nonce_, nonce_, me_.node, transcript);
  challenge_ = fields;
  challenge_.insert(challenge_.end(), reinterpret_cast<const std::byte*>(mac.data()),
                    reinterpret_cast<const std::byte*>(mac.data()) + mac.size());
  return challenge_;
}

void acceptor_handshake::on_proof(const std::vector<std::byte>& body) {
  const std::string who = "node " + std::to_string(peer_node_) + " (claimed)";
  if (challenge_.empty()) throw auth_failure(auth_error::malformed, who + ": a proof before the challenge");
  if (body.size() != proof_bytes)
    throw auth_failure(auth_error::malformed,
                       who + ": proof of " + std::to_string(body.size()) + " bytes, expected " +
                           std::to_string(proof_bytes));
  std::vector<std::byte> transcript = hello_;
  transcript.insert(transcript.end(), challenge_.begin(), challenge_.end());
  const digest expected = transcript_mac(me_.secret, "troupe proof", nonce_, peer_nonce_, peer_node_, transcript);
  if (!equal_constant_time(expected.data(), body.data(), mac_bytes))
    throw auth_failure(auth_error::bad_mac, who + " failed authentication: its proof does not match the shared "
                                                  "secret (is the secret file the same on every node?)");
  keys_ = derive_keys(me_.secret, peer_nonce_, nonce_, peer_node_, me_.node, transcript, false);
}

digest job_digest(const std::string& job_hash) {
  digest d{};
  unsigned int n = 0;
  if (EVP_Digest(job_hash.data(), job_hash.size(), d.data(), &n, EVP_sha256(), nullptr) != 1 || n != d.size())
    throw error("job_digest: SHA-256 failed (OpenSSL)");
  return d;
}

digest hmac_sha256(const std::string& key, const void* data, std::size_t bytes) {
  digest d{};
  unsigned int n = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), static_cast<const unsigned char*>(data), bytes,
            d.data(), &n) ||
      n != d.size())
    throw error("hmac_sha256: HMAC failed (OpenSSL)");
  return d;
}

bool equal_constant_time(const void* a, const void* b, std::size_t bytes) { return CRYPTO_memcmp(a, b, bytes) == 0; }

void random_bytes(void* out, std::size_t bytes) {
  if (RAND_bytes(static_cast<unsigned char*>(out), static_cast<int>(bytes)) != 1)
    throw error("random_bytes: OpenSSL's RAND_bytes failed (no entropy source?)");
}

uint64_t random_id() {
  uint64_t v = 0;
  while (v == 0) random_bytes(&v, sizeof v);
  return v;
}

std::string read_secret_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw error("secret file '" + path + "': " + std::strerror(errno) +
                " (create it with a random secret, e.g. `openssl rand -hex 32 > " + path + "; chmod 600 " + path +
                "`, the same file on every node)");
  if (!S_ISREG(st.st_mode)) throw error("secret file '" + path + "' is not a regular file");
  if (st.st_uid != ::geteuid())
    throw error("secret file '" + path + "' belongs to user " + std::to_string(st.st_uid) + ", not to the user running "
                "this node (" + std::to_string(::geteuid()) + "): chown it, or make your own (openssl rand -hex 32 > " +
                path + "; chmod 600 " + path + ")");
  if (st.st_mode & 077)
    throw error("permissions " + octal(st.st_mode) + " for '" + path + "' are too open; chmod 600 " + path);
  std::ifstream f(path, std::ios::binary);
  if (!f) throw error("secret file '" + path + "' cannot be read");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (!s.empty() && s.back() == '\n') s.pop_back();
  if (!s.empty() && s.back() == '\r') s.pop_back();
  if (s.empty()) throw error("secret file '" + path + "' is empty: put a random secret in it (openssl rand -hex 32)");
  if (s.size() < min_secret_bytes)
    throw error("secret file '" + path + "' holds " + std::to_string(s.size()) + " bytes; a secret needs at least " +
                std::to_string(min_secret_bytes) + ": put a random one in it (openssl rand -hex 32 > " + path + ")");
  return s;
}

} // namespace troupe::net
