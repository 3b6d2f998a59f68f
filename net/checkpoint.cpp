#include "net/checkpoint.hpp"

#include <algorithm>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fcntl.h>
#include <kj/exception.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "net/checkpoint.capnp.h"
#include "net/tensor_codec.hpp"

namespace troupe::net {

namespace {
constexpr uint32_t format_version = 1;

std::string sys_error(const std::string& what) { return what + ": " + std::strerror(errno); }
} // namespace

void save_checkpoint(const std::string& path, const checkpoint& c) {
  capnp::MallocMessageBuilder msg;
  try {
    auto root = msg.initRoot<wire::Checkpoint>();
    root.setFormatVersion(format_version);
    root.setArchitecture(c.architecture);
    root.setEpoch(c.epoch);
    root.setStep(c.step);
    root.setOptimizerKind(c.optimizer_kind);
    encode(c.params, root.initParams(static_cast<unsigned>(c.params.size())));
    encode(c.optimizer, root.initOptimizer(static_cast<unsigned>(c.optimizer.size())));
    auto versions = root.initShardVersions(static_cast<unsigned>(c.shard_versions.size()));
    for (unsigned i = 0; i < versions.size(); ++i) versions.set(i, c.shard_versions[i]);
  } catch (const kj::Exception& e) {
    throw error("building checkpoint " + path + " failed: " + e.getDescription().cStr());
  }

  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw error(sys_error("cannot write checkpoint " + tmp));
  try {
    capnp::writeMessageToFd(fd, msg);
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
    if (root.getFormatVersion() != format_version)
      throw error("checkpoint " + path + " has format version " + std::to_string(root.getFormatVersion()) +
                  ", this troupe reads version " + std::to_string(format_version));
    checkpoint c;
    c.architecture = root.getArchitecture();
    c.epoch = root.getEpoch();
    c.step = root.getStep();
    c.optimizer_kind = root.getOptimizerKind();
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
