// What sealing a frame costs the CPU, one core, per frame size: OpenSSL's
// ChaCha20-Poly1305 and AES-256-GCM, the payload authenticated only (additional
// data) or encrypted, the same EVP calls frame_cipher makes; and troupe's
// frame_cipher itself (net/frame_cipher.hpp), which takes ChaCha20-Poly1305 to
// authenticate (the default; up to schema version 2 it was AES-256-GCM's GMAC)
// and AES-256-GCM to encrypt (`encrypt = true`). The candidates take turns
// within each round; medians over the rounds, GB/s = 10^9 bytes of payload per
// second, and ns per frame.
//
//   build/bench/troupe_aead_bench [--rounds 5] [--sizes 64,1K,16K,256K,1M] [--bytes-per-point 200M]
#include <openssl/evp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "net/frame_cipher.hpp"

namespace {

using troupe::net::frame_cipher;

std::size_t parse_size(const std::string& s) {
  const char u = s.empty() ? '\0' : s.back();
  const std::size_t mult = u == 'K' ? std::size_t(1) << 10 : u == 'M' ? std::size_t(1) << 20 : 1;
  return std::stoull(mult == 1 ? s : s.substr(0, s.size() - 1)) * mult;
}

// One AEAD as frame_cipher calls it: a fresh nonce per frame, the header as
// additional data, the payload additional data too (authenticated) or
// encrypted, then the tag.
class evp_sealer {
public:
  evp_sealer(const EVP_CIPHER* aead, bool encrypt) : ctx_(EVP_CIPHER_CTX_new()), encrypt_(encrypt) {
    const unsigned char key[32] = {7};
    if (!ctx_ || EVP_EncryptInit_ex(ctx_, aead, nullptr, key, nullptr) != 1) std::abort();
  }
  ~evp_sealer() { EVP_CIPHER_CTX_free(ctx_); }
  void seal(const unsigned char* head, const unsigned char* in, unsigned char* out, int bytes) {
    unsigned char iv[12] = {};
    for (int i = 0; i < 8; ++i) iv[4 + i] = static_cast<unsigned char>(counter_ >> (8 * i));
    ++counter_;
    int n = 0;
    unsigned char tag[16], rest[16];
    if (EVP_EncryptInit_ex(ctx_, nullptr, nullptr, nullptr, iv) != 1 ||
        EVP_EncryptUpdate(ctx_, nullptr, &n, head, 64) != 1 ||
        EVP_EncryptUpdate(ctx_, encrypt_ ? out : nullptr, &n, in, bytes) != 1 ||
        EVP_EncryptFinal_ex(ctx_, rest, &n) != 1 || EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_AEAD_GET_TAG, 16, tag) != 1)
      std::abort();
  }

private:
  EVP_CIPHER_CTX* ctx_;
  bool encrypt_;
  uint64_t counter_ = 0;
};

struct candidate {
  std::string name;
  std::function<void(const unsigned char*, const unsigned char*, unsigned char*, std::size_t)> seal;
};

std::vector<candidate> candidates() {
  static troupe::net::frame_key key{};
  key[0] = 7;
  static frame_cipher auth(key, frame_cipher::direction::seal, false), enc(key, frame_cipher::direction::seal, true);
  static evp_sealer chacha_auth(EVP_chacha20_poly1305(), false), gcm_auth(EVP_aes_256_gcm(), false),
      chacha_enc(EVP_chacha20_poly1305(), true), gcm_enc(EVP_aes_256_gcm(), true);
  auto troupe_seal = [](frame_cipher& c) {
    return [&c](const unsigned char* head, const unsigned char* in, unsigned char* out, std::size_t bytes) {
      c.begin();
      c.authenticate(head, 64);
      // Authenticated only, the payload is sealed where it lies (as out_frame::seal does).
      unsigned char* to = c.confidential() ? out : const_cast<unsigned char*>(in);
      c.payload(reinterpret_cast<const std::byte*>(in), reinterpret_cast<std::byte*>(to), bytes);
      (void)c.finish();
    };
  };
  auto evp = [](evp_sealer& g) {
    return [&g](const unsigned char* head, const unsigned char* in, unsigned char* out, std::size_t bytes) {
      g.seal(head, in, out, static_cast<int>(bytes));
    };
  };
  return {{"ChaCha20-Poly1305, authenticated", evp(chacha_auth)},
          {"AES-256-GCM, authenticated (GMAC)", evp(gcm_auth)},
          {"troupe's frame_cipher, authenticated", troupe_seal(auth)},
          {"ChaCha20-Poly1305, encrypted", evp(chacha_enc)},
          {"AES-256-GCM, encrypted", evp(gcm_enc)},
          {"troupe's frame_cipher, encrypted", troupe_seal(enc)}};
}

} // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  std::string sizes = "64,1K,16K,256K,1M";
  std::size_t per_point = std::size_t(200) << 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--rounds") rounds = std::max(1, std::atoi(v.c_str()));
    else if (a == "--sizes") sizes = v;
    else if (a == "--bytes-per-point") per_point = parse_size(v);
    else {
      std::fprintf(stderr, "usage: troupe_aead_bench [--rounds N] [--sizes 64,1K,16K,256K,1M] [--bytes-per-point 200M]\n");
      return 2;
    }
  }
  const std::vector<candidate> cs = candidates();
  std::printf("| size | candidate | GB/s | ns per frame |\n|---|---|---|---|\n");
  std::stringstream list(sizes);
  for (std::string s; std::getline(list, s, ',');) {
    const std::size_t bytes = parse_size(s);
    std::vector<unsigned char> head(64, 1), in(bytes, 2), out(bytes);
    const std::size_t frames = std::max<std::size_t>(1, per_point / (bytes + 64));
    std::vector<std::vector<double>> secs(cs.size());
    for (int r = 0; r < rounds; ++r)
      for (std::size_t c = 0; c < cs.size(); ++c) {
        const auto t0 = std::chrono::steady_clock::now();
        for (std::size_t f = 0; f < frames; ++f) cs[c].seal(head.data(), in.data(), out.data(), bytes);
        secs[c].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    for (std::size_t c = 0; c < cs.size(); ++c) {
      auto& v = secs[c];
      std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
      const double t = v[v.size() / 2];
      std::printf("| %s | %s | %.2f | %.0f |\n", s.c_str(), cs[c].name.c_str(), double(frames) * bytes / t / 1e9,
                  t / double(frames) * 1e9);
    }
  }
}
