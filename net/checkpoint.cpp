#include "net/checkpoint.hpp"

#include <algorithm>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fcntl.h>
#include <kj/exception.h>
#include <kj/io.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <memory>

#include "net/checkpoint.capnp.h"
#include "net/tensor_codec.hpp"

namespace troupe::net {

namespace {
/// 2: the Checkpoint message is followed by a CheckpointSeal (its SHA-256).
constexpr uint32_t format_version = 2;
/// Written before the seal: read without a checksum.
constexpr uint32_t unsealed_version = 1;

using digest = std::array<unsigned char, 32>;

std::string sys_error(const std::string& what) { return what + ": " + std::strerror(errno); }

/// Where save_checkpoint writes before its rename: beside `path`.
std::string temporary_of(const std::string& path) { return path + ".tmp." + std::to_string(::getpid()); }

/// The temporary file `tmp` opened for writing, empty; throws troupe::error starting with `what`.
int open_temporary(const std::string& tmp, const std::string& what) {
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw error(sys_error(what + tmp));
  return fd;
}

std::string hex(const unsigned char* p, std::size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < n; ++i) {
    out += digits[p[i] >> 4];
    out += digits[p[i] & 15];
  }
  return out;
}

/// A running SHA-256 (OpenSSL's EVP interface).
class sha256 {
public:
  sha256() : ctx_(EVP_MD_CTX_new(), EVP_MD_CTX_free) {
    if (!ctx_ || EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) != 1)
      throw error("checkpoint: SHA-256 is not available (OpenSSL)");
  }
  void update(const void* p, std::size_t n) {
    if (n && EVP_DigestUpdate(ctx_.get(), p, n) != 1) throw error("checkpoint: SHA-256 failed (OpenSSL)");
  }
  digest finish() {
    digest d{};
    unsigned int len = 0;
    if (EVP_DigestFinal_ex(ctx_.get(), d.data(), &len) != 1 || len != d.size())
      throw error("checkpoint: SHA-256 failed (OpenSSL)");
    return d;
  }

private:
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx_;
};

/// Writes to a file descriptor and hashes what it writes.
class hashing_output final : public kj::OutputStream {
public:
  explicit hashing_output(int fd) : out_(fd) {}
  void write(const void* buffer, size_t size) override {
    hash.update(buffer, size);
    bytes += size;
    out_.write(buffer, size);
  }
  void write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    for (const auto& p : pieces) {
      hash.update(p.begin(), p.size());
      bytes += p.size();
    }
    out_.write(pieces);
  }
  sha256 hash;
  uint64_t bytes = 0;

private:
  kj::FdOutputStream out_;
};

/// Writes the Checkpoint message `msg` and its seal to `fd`.
void write_sealed(int fd, capnp::MessageBuilder& msg) {
  hashing_output out(fd);
  capnp::writeMessage(out, msg);
  const digest d = out.hash.finish();
  capnp::MallocMessageBuilder seal_msg;
  auto seal = seal_msg.initRoot<wire::CheckpointSeal>();
  seal.setSha256(kj::arrayPtr(reinterpret_cast<const kj::byte*>(d.data()), d.size()));
  seal.setBytes(out.bytes);
  capnp::writeMessageToFd(fd, seal_msg);
}

/// Checks the seal that follows the Checkpoint message [words, end) in the
/// file [words, file_end); throws troupe::error naming `path` when it is
/// missing or does not match. A format 1 file has no seal.
void verify_seal(const std::string& path, const capnp::word* words, const capnp::word* end,
                 const capnp::word* file_end, uint32_t version) {
  const auto corrupt = [&path](const std::string& why) {
    return error("checkpoint " + path + " is corrupt: " + why +
                 ". It was damaged after it was written: resume from another copy, or delete it to start over");
  };
  if (end == file_end) {
    if (version == unsealed_version) return;
    throw corrupt("no checksum after its contents (the file is cut short)");
  }
  capnp::FlatArrayMessageReader reader(kj::arrayPtr(end, file_end));
  if (reader.getEnd() != file_end) throw corrupt("bytes after its checksum");
  auto seal = reader.getRoot<wire::CheckpointSeal>();
  const uint64_t bytes = static_cast<uint64_t>(end - words) * sizeof(capnp::word);
  auto stored = seal.getSha256();
  if (seal.getBytes() != bytes || stored.size() != digest().size())
    throw corrupt("checksum mismatch (the seal covers " + std::to_string(seal.getBytes()) + " bytes, the contents are " +
                  std::to_string(bytes) + ")");
  sha256 h;
  h.update(words, bytes);
  const digest d = h.finish();
  if (std::memcmp(d.data(), stored.begin(), d.size()) != 0)
    throw corrupt("checksum mismatch (SHA-256 of its " + std::to_string(bytes) + " bytes of contents is " +
                  hex(d.data(), d.size()) + ", the file says " + hex(stored.begin(), stored.size()) + ")");
}
} // namespace

void check_checkpoint_writable(const std::string& path) {
  if (path.empty()) return;
  const std::string tmp = temporary_of(path);
  ::close(open_temporary(tmp, "--checkpoint: cannot write "));
  ::unlink(tmp.c_str());
}

void save_checkpoint(const std::string& path, const checkpoint& c) {
  capnp::MallocMessageBuilder msg;
  try {
    auto root = msg.initRoot<wire::Checkpoint>();
    root.setFormatVersion(format_version);
    root.setArchitecture(c.architecture);
    root.setEpoch(c.epoch);
    root.setStep(c.step);
    root.setEpochSamples(c.epoch_samples);
    root.setOptimizerKind(c.optimizer_kind);
    if (!c.vocabulary.empty())
      root.setVocabulary(kj::arrayPtr(reinterpret_cast<const capnp::byte*>(c.vocabulary.data()), c.vocabulary.size()));
    encode(c.params, root.initParams(static_cast<unsigned>(c.params.size())));
    encode(c.optimizer, root.initOptimizer(static_cast<unsigned>(c.optimizer.size())));
    auto versions = root.initShardVersions(static_cast<unsigned>(c.shard_versions.size()));
    for (unsigned i = 0; i < versions.size(); ++i) versions.set(i, c.shard_versions[i]);
  } catch (const kj::Exception& e) {
    throw error("building checkpoint " + path + " failed: " + e.getDescription().cStr());
  }

  std::string tmp = temporary_of(path);
  int fd = open_temporary(tmp, "cannot write checkpoint ");
  try {
    write_sealed(fd, msg);
  } catch (const kj::Exception& e) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw error("writing checkpoint " + tmp + " failed: " + e.getDescription().cStr());
  }
  if (::fsync(fd) != 0) {
    std::string m = sys_error("fsync of checkpoint " + tmp);
    ::close(fd);
    ::unlink(tmp.c_str());
    throw error(m);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string m = sys_error("cannot rename " + tmp + " to " + path);
    ::unlink(tmp.c_str());
    throw error(m);
  }
  // Make the rename itself durable.
  std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/'));
  if (dir.empty()) dir = "/";
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

checkpoint load_checkpoint(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw error(sys_error("cannot open checkpoint " + path));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw error(sys_error("cannot stat checkpoint " + path));
  }
  std::size_t bytes = static_cast<std::size_t>(st.st_size);
  if (bytes < 8 || bytes % 8 != 0) {
    ::close(fd);
    throw error("checkpoint " + path + " is not a troupe checkpoint (" + std::to_string(bytes) +
                " bytes, truncated or corrupt)");
  }
  // Word-aligned buffer: Cap'n Proto reads in place only from aligned memory.
  kj::Array<capnp::word> words = kj::heapArray<capnp::word>(bytes / 8);
  std::size_t done = 0;
  char* dst = reinterpret_cast<char*>(words.begin());
  while (done < bytes) {
    ssize_t n = ::read(fd, dst + done, bytes - done);
    if (n <= 0) {
      ::close(fd);
      throw error(sys_error("reading checkpoint " + path));
    }
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  try {
    capnp::ReaderOptions opts;
    opts.traversalLimitInWords = bytes / 8 + 1024;  // the file itself bounds what can be read
    capnp::FlatArrayMessageReader reader(words.asPtr(), opts);
    auto root = reader.getRoot<wire::Checkpoint>();
    const uint32_t version = root.getFormatVersion();
    verify_seal(path, words.begin(), reader.getEnd(), words.end(), version);
    if (version != format_version && version != unsealed_version)
      throw error("checkpoint " + path + " has format version " + std::to_string(version) +
                  ", this troupe reads versions " + std::to_string(unsealed_version) + " and " +
                  std::to_string(format_version) + " (a newer troupe wrote it?)");
    checkpoint c;
    c.architecture = root.getArchitecture();
    c.epoch = root.getEpoch();
    c.step = root.getStep();
    c.epoch_samples = root.getEpochSamples();
    c.optimizer_kind = root.getOptimizerKind();
    const auto vocabulary = root.getVocabulary();
    c.vocabulary.assign(reinterpret_cast<const char*>(vocabulary.begin()), vocabulary.size());
    c.params = decode(root.getParams(), "checkpoint " + path + " params");
    c.optimizer = decode(root.getOptimizer(), "checkpoint " + path + " optimizer");
    for (uint64_t v : root.getShardVersions()) c.shard_versions.push_back(v);
    return c;
  } catch (const kj::Exception& e) {
    throw error("checkpoint " + path + " is corrupt: " + e.getDescription().cStr());
  }
}

uint64_t state_digest(const std::vector<named_tensor>& ts) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  for (const auto& t : ts) {
    mix(t.name.data(), t.name.size() + 1);
    for (int64_t d : t.value.shape().dims()) mix(&d, sizeof d);
    mix(t.value.data(), static_cast<std::size_t>(t.value.numel()) * sizeof(float));
  }
  return h;
}

std::vector<named_tensor> shard_state(const checkpoint& c, uint32_t shard) {
  const std::string prefix = "shard" + std::to_string(shard) + "/";
  std::vector<named_tensor> out;
  for (const auto& t : c.optimizer)
    if (t.name.rfind(prefix, 0) == 0) out.push_back({t.name.substr(prefix.size()), t.value});
  std::sort(out.begin(), out.end(), [](const named_tensor& a, const named_tensor& b) { return a.name < b.name; });
  return out;
}

} // namespace troupe::net
