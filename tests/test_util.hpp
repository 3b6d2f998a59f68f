#pragma once

// Helpers shared by the test files: a self-removing temporary directory and a
// matcher on troupe::error messages.

#include <catch2/catch.hpp>
#include <stdlib.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensor/error.hpp"

namespace troupe::testing {

/// Matches a troupe::error whose message matches a string matcher.
template <typename M>
class message_matcher : public Catch::MatcherBase<troupe::error> {
public:
  explicit message_matcher(M m) : m_(std::move(m)) {}
  bool match(const troupe::error& e) const override { return m_.match(std::string(e.what())); }
  std::string describe() const override { return "has a message that " + m_.toString(); }

private:
  M m_;
};
template <typename M>
message_matcher<M> message(M m) {
  return message_matcher<M>(std::move(m));
}

/// Two runs' losses, step by step: the same count, each within `tolerance`
/// of the expected one, relative to it (`relative`) or absolute.
inline void check_same_losses(const std::vector<double>& got, const std::vector<double>& expected, double tolerance,
                              bool relative = true) {
  REQUIRE(got.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(std::abs(got[i] - expected[i]) <= tolerance * (relative ? std::abs(expected[i]) : 1.0));
  }
}

/// A fresh directory under $TMPDIR (or /tmp), removed with everything in it.
class temp_dir {
public:
  explicit temp_dir(const std::string& prefix = "troupe_test") {
    const char* t = std::getenv("TMPDIR");
    std::string tmpl = std::string(t && *t ? t : "/tmp") + "/" + prefix + ".XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (!::mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed for " + tmpl);
    path_ = buf.data();
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }
  /// Names of the files in the directory.
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (auto& e : std::filesystem::directory_iterator(path_)) out.push_back(e.path().filename().string());
    return out;
  }

private:
  std::string path_;
};

inline void put_be32(std::vector<uint8_t>& b, uint32_t v) {
  b.push_back(uint8_t(v >> 24));
  b.push_back(uint8_t(v >> 16));
  b.push_back(uint8_t(v >> 8));
  b.push_back(uint8_t(v));
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

/// Writes `prefix`-images-idx3-ubyte and -labels-idx1-ubyte with `count` 28x28
/// images: image i has label i % 10, and class k lights up the k-th 7x7 block of
/// a 4x4 grid over noise, so the task is easy to learn.
inline void write_split(const std::string& dir, const std::string& prefix, uint32_t count, uint32_t seed,
                 int label_shift = 0) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> img, lab;
  put_be32(img, 0x00000803);
  put_be32(img, count);
  put_be32(img, 28);
  put_be32(img, 28);
  put_be32(lab, 0x00000801);
  put_be32(lab, count);
  for (uint32_t i = 0; i < count; ++i) {
    int k = static_cast<int>(i % 10);
    int br = k / 4, bc = k % 4;
    for (int r = 0; r < 28; ++r)
      for (int c = 0; c < 28; ++c) {
        bool on = r / 7 == br && c / 7 == bc;
        img.push_back(static_cast<uint8_t>(on ? 170 + rng() % 86 : rng() % 90));
      }
    lab.push_back(static_cast<uint8_t>((k + label_shift) % 10));
  }
  write_bytes(dir + "/" + prefix + "-images-idx3-ubyte", img);
  write_bytes(dir + "/" + prefix + "-labels-idx1-ubyte", lab);
}

/// A directory holding a Fashion-MNIST-shaped dataset: 256 train, 64 test images.
inline void write_dataset(const std::string& dir) {
  write_split(dir, "train", 256, 1);
  write_split(dir, "t10k", 64, 2);
}

/// A periodic text of about 2800 bytes and 27 distinct characters, for language models.
inline std::string small_text() {
  std::string t;
  for (int i = 0; i < 64; ++i) t += "the quick brown fox jumps over a lazy dog. ";
  return t;
}

} // namespace troupe::testing
