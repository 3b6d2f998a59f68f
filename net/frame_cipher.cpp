#include "net/frame_cipher.hpp"

#include <openssl/evp.h>

#include <cstring>
#include <limits>
#include <string>

#include "tensor/error.hpp"

namespace troupe::net {

namespace {

[[noreturn]] void openssl_failed(const char* what) {
  throw error(std::string("frame protection: OpenSSL's AEAD (ChaCha20-Poly1305 or AES-256-GCM) failed in ") + what);
}

// Authenticated only: ChaCha20-Poly1305 (RFC 8439); OpenSSL 3.0's Poly1305 uses AVX-512 IFMA where
// the CPU has it and ran at 1.45x GHASH's rate on the Zen 4 of docs/benchmarks.md. Encrypted:
// AES-256-GCM, whose AES-NI encryption ran 1.2x faster than ChaCha20 there
// (bench/aead_bench.cpp; docs/benchmarks.md, "Frame protection").
const EVP_CIPHER* aead_for(bool confidential) { return confidential ? EVP_aes_256_gcm() : EVP_chacha20_poly1305(); }

// OpenSSL takes int lengths: larger spans go in pieces.
template <typename F>
void in_pieces(std::size_t bytes, F&& f) {
  constexpr std::size_t piece = std::size_t(1) << 30;
  for (std::size_t at = 0; at < bytes; at += piece) f(at, static_cast<int>(std::min(piece, bytes - at)));
}

} // namespace

frame_cipher::frame_cipher(const frame_key& key, direction d, bool confidential)
    : ctx_(EVP_CIPHER_CTX_new()), dir_(d), confidential_(confidential) {
  if (!ctx_) openssl_failed("EVP_CIPHER_CTX_new");
  const EVP_CIPHER* aead = aead_for(confidential);
  const int ok = d == direction::seal ? EVP_EncryptInit_ex(ctx_, aead, nullptr, key.data(), nullptr)
                                      : EVP_DecryptInit_ex(ctx_, aead, nullptr, key.data(), nullptr);
  if (ok != 1) {
    EVP_CIPHER_CTX_free(ctx_);
    openssl_failed("init");
  }
}

frame_cipher::~frame_cipher() { EVP_CIPHER_CTX_free(ctx_); }

void frame_cipher::begin() {
  // 96-bit nonce: 4 zero bytes, then the frame's number (little-endian). Each
  // direction of each link has its own key, so a number is never used twice under one key.
  unsigned char iv[12] = {};
  for (int i = 0; i < 8; ++i) iv[4 + i] = static_cast<unsigned char>(counter_ >> (8 * i));
  ++counter_;
  in_payload_ = false;
  const int ok = dir_ == direction::seal ? EVP_EncryptInit_ex(ctx_, nullptr, nullptr, nullptr, iv)
                                         : EVP_DecryptInit_ex(ctx_, nullptr, nullptr, nullptr, iv);
  if (ok != 1) openssl_failed("begin");
}

void frame_cipher::authenticate(const void* data, std::size_t bytes) {
  if (in_payload_ && confidential_) throw error("frame_cipher::authenticate after the payload began");
  const auto* p = static_cast<const unsigned char*>(data);
  in_pieces(bytes, [&](std::size_t at, int n) {
    int out = 0;
    const int ok = dir_ == direction::seal ? EVP_EncryptUpdate(ctx_, nullptr, &out, p + at, n)
                                           : EVP_DecryptUpdate(ctx_, nullptr, &out, p + at, n);
    if (ok != 1) openssl_failed("authenticate");
  });
}

void frame_cipher::payload(const std::byte* in, std::byte* out, std::size_t bytes) {
  in_payload_ = true;
  if (!confidential_) {
    authenticate(in, bytes);
    if (out != in && bytes) std::memmove(out, in, bytes);
    return;
  }
  const auto* src = reinterpret_cast<const unsigned char*>(in);
  auto* dst = reinterpret_cast<unsigned char*>(out);
  in_pieces(bytes, [&](std::size_t at, int n) {
    int written = 0;
    const int ok = dir_ == direction::seal ? EVP_EncryptUpdate(ctx_, dst + at, &written, src + at, n)
                                           : EVP_DecryptUpdate(ctx_, dst + at, &written, src + at, n);
    if (ok != 1 || written != n) openssl_failed("payload");
  });
}

frame_tag frame_cipher::finish() {
  if (dir_ != direction::seal) throw error("frame_cipher::finish on an opening cipher");
  int n = 0;
  unsigned char rest[16];
  if (EVP_EncryptFinal_ex(ctx_, rest, &n) != 1) openssl_failed("finish");
  frame_tag tag{};
  if (EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_AEAD_GET_TAG, static_cast<int>(frame_tag_bytes), tag.data()) != 1)
    openssl_failed("get tag");
  return tag;
}

bool frame_cipher::verify(const frame_tag& tag) {
  if (dir_ != direction::open) throw error("frame_cipher::verify on a sealing cipher");
  frame_tag copy = tag;
  if (EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_AEAD_SET_TAG, static_cast<int>(frame_tag_bytes), copy.data()) != 1)
    openssl_failed("set tag");
  int n = 0;
  unsigned char rest[16];
  return EVP_DecryptFinal_ex(ctx_, rest, &n) == 1;
}

} // namespace troupe::net
