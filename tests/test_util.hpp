#pragma once

// Helpers shared by the test files: a self-removing temporary directory and a
// matcher on troupe::error messages.

#include <catch2/catch.hpp>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
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

} // namespace troupe::testing
