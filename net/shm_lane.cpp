#include "net/shm_lane.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "tensor/error.hpp"

namespace troupe::net {

namespace {

// The smallest region made or mapped.
constexpr std::size_t min_region_bytes = std::size_t(64) << 10;

enum : uint32_t { slot_writing = 0, slot_written = 1, slot_released = 2, slot_taken = 3 };

uint32_t* state_at(std::byte* header) { return reinterpret_cast<uint32_t*>(header); }
uint64_t* size_at(std::byte* header) { return reinterpret_cast<uint64_t*>(header + 8); }

std::string system_error(const std::string& what) { return what + ": " + std::strerror(errno); }

bool valid_name(const std::string& n) {
  return n.size() > 8 && n.size() <= lane_max_name && n.compare(0, 8, "/troupe-") == 0 &&
         n.find('/', 1) == std::string::npos;
}

// Closes the descriptor when it goes.
struct fd_guard {
  int fd;
  ~fd_guard() {
    if (fd >= 0) ::close(fd);
  }
};

} // namespace

std::size_t remove_stale_lanes(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return 0;
  std::size_t removed = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    int pid = 0;
    char rest[lane_max_name + 1];
    if (n.size() > lane_max_name || std::sscanf(n.c_str(), "troupe-%d-%64s", &pid, rest) != 2 || pid <= 0) continue;
    struct stat st {};
    if (::stat((dir + "/" + n).c_str(), &st) != 0 || st.st_uid != ::geteuid()) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // its creator may still use it
    removed += ::shm_unlink(("/" + n).c_str()) == 0;
  }
  ::closedir(d);
  return removed;
}

std::string encode_lane_offer(const lane_offer& o) {
  std::string s(16, '\0');
  std::memcpy(&s[0], &o.id, 8);
  std::memcpy(&s[8], &o.bytes, 8);
  return s + o.name;
}

lane_offer decode_lane_offer(const void* body, std::size_t bytes) {
  if (bytes < 16 || bytes > 16 + lane_max_name) throw error("lane offer of " + std::to_string(bytes) + " bytes");
  lane_offer o;
  std::memcpy(&o.id, body, 8);
  std::memcpy(&o.bytes, static_cast<const char*>(body) + 8, 8);
  o.name.assign(static_cast<const char*>(body) + 16, bytes - 16);
  if (!valid_name(o.name)) throw error("lane offer with a name that is not a troupe region's");
  return o;
}

// ---- the sending side ----

std::unique_ptr<lane_ring> lane_ring::create(std::size_t bytes) {
  static const std::size_t swept = remove_stale_lanes();  // once a process: what killed nodes left behind
  (void)swept;
  std::unique_ptr<lane_ring> r(new lane_ring());
  r->bytes_ = std::max(min_region_bytes, (bytes + 4095) / 4096 * 4096);
  std::random_device rd;
  r->id_ = (uint64_t(rd()) << 32 | rd()) | 1;
  char name[lane_max_name + 1];
  std::snprintf(name, sizeof name, "/troupe-%d-%016llx", static_cast<int>(::getpid()),
                static_cast<unsigned long long>(r->id_));
  r->name_ = name;
  fd_guard fd{::shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600)};
  if (fd.fd < 0) throw error(system_error("cannot create shared memory " + r->name_));
  auto fail = [&](const std::string& what) {
    const std::string why = system_error(what);
    ::shm_unlink(name);
    throw error(why);
  };
  if (::ftruncate(fd.fd, static_cast<off_t>(r->bytes_)) != 0) fail("cannot size shared memory " + r->name_);
  if (int e = ::posix_fallocate(fd.fd, 0, static_cast<off_t>(r->bytes_)); e != 0) {
    errno = e;
    fail("cannot reserve " + std::to_string(r->bytes_) + " bytes of shared memory (is /dev/shm full?)");
  }
  void* p = ::mmap(nullptr, r->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd.fd, 0);
  if (p == MAP_FAILED) fail("cannot map shared memory " + r->name_);
  r->base_ = static_cast<std::byte*>(p);
  return r;
}

lane_ring::~lane_ring() {
  if (base_) ::munmap(base_, bytes_);
  if (named_) ::shm_unlink(name_.c_str());  // the receiver removes it when it maps it: ENOENT then
}

void lane_ring::reclaim() {
  while (!slots_.empty() && __atomic_load_n(state_at(base_ + slots_.front().at), __ATOMIC_ACQUIRE) == slot_released) {
    in_use_ -= slots_.front().bytes;
    slots_.pop_front();
  }
  if (slots_.empty()) head_ = 0;
}

std::optional<lane_ring::slot> lane_ring::allocate(std::size_t payload) {
  if (payload == 0 || payload % 8 != 0) throw error("lane_ring::allocate: a payload of " + std::to_string(payload) + " bytes");
  const uint64_t need = lane_slot_header_bytes + payload;
  std::lock_guard<std::mutex> lock(m_);
  if (need > bytes_) return std::nullopt;
  reclaim();
  uint64_t at = 0;
  if (!slots_.empty()) {
    const uint64_t tail = slots_.front().at;  // the oldest slot still held
    if (head_ > tail) {
      if (head_ + need <= bytes_)
        at = head_;
      else if (need <= tail)
        at = 0;  // wraps: the end of the region stays unused this round
      else
        return std::nullopt;
    } else if (head_ < tail && head_ + need <= tail) {
      at = head_;
    } else {
      return std::nullopt;  // head_ == tail: full
    }
  }
  std::byte* h = base_ + at;
  __atomic_store_n(state_at(h), uint32_t(slot_writing), __ATOMIC_RELAXED);
  *size_at(h) = payload;
  slots_.push_back({at, need});
  head_ = at + need;
  in_use_ += need;
  return slot{at + lane_slot_header_bytes, h + lane_slot_header_bytes, payload};
}

void lane_ring::publish(const slot& s) {
  __atomic_store_n(state_at(base_ + s.offset - lane_slot_header_bytes), uint32_t(slot_written), __ATOMIC_RELEASE);
}

std::size_t lane_ring::in_use() const {
  std::lock_guard<std::mutex> lock(m_);
  return in_use_;
}

// ---- the receiving side ----

std::shared_ptr<lane_view> lane_view::open(const lane_offer& o) {
  if (!valid_name(o.name)) throw error("shared memory '" + o.name + "' is not a troupe region");
  fd_guard fd{::shm_open(o.name.c_str(), O_RDWR, 0)};
  if (fd.fd < 0) throw error(system_error("cannot open shared memory " + o.name + " (is the peer on another host?)"));
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) throw error(system_error("cannot stat shared memory " + o.name));
  if (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0 || !S_ISREG(st.st_mode))
    throw error("shared memory " + o.name + " is not this user's alone; not used");
  if (o.bytes < min_region_bytes || static_cast<uint64_t>(st.st_size) != o.bytes)
    throw error("shared memory " + o.name + " is " + std::to_string(st.st_size) + " bytes, the offer said " +
                std::to_string(o.bytes));
  void* p = ::mmap(nullptr, o.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.fd, 0);
  if (p == MAP_FAILED) throw error(system_error("cannot map shared memory " + o.name));
  ::shm_unlink(o.name.c_str());  // nobody else opens it from now on
  std::shared_ptr<lane_view> v(new lane_view());
  v->id_ = o.id;
  v->bytes_ = o.bytes;
  v->base_ = static_cast<std::byte*>(p);
  return v;
}

lane_view::~lane_view() {
  if (base_) ::munmap(base_, bytes_);
}

namespace {
// Holds the region while the message lives; releases its slot when it goes.
struct taken_slot {
  std::shared_ptr<lane_view> view;
  uint32_t* state;
  ~taken_slot() { __atomic_store_n(state, uint32_t(slot_released), __ATOMIC_RELEASE); }
};
} // namespace

std::shared_ptr<const void> lane_view::take(uint64_t offset, uint64_t bytes, const capnp::word** words, std::string* why) {
  auto refuse = [&](const std::string& w) -> std::shared_ptr<const void> {
    if (why) *why = w;
    return nullptr;
  };
  if (bytes == 0 || bytes % 8 != 0 || offset % 8 != 0 || offset < lane_slot_header_bytes || offset > bytes_ ||
      bytes > bytes_ - offset)
    return refuse(std::to_string(bytes) + " bytes at offset " + std::to_string(offset) + " do not fit a region of " +
                  std::to_string(bytes_) + " bytes");
  std::byte* h = base_ + offset - lane_slot_header_bytes;
  uint32_t expected = slot_written;
  if (!__atomic_compare_exchange_n(state_at(h), &expected, uint32_t(slot_taken), false, __ATOMIC_ACQUIRE,
                                   __ATOMIC_RELAXED))
    return refuse("the slot at offset " + std::to_string(offset) + " is not published, or taken already");
  if (*size_at(h) != bytes) {
    __atomic_store_n(state_at(h), uint32_t(slot_released), __ATOMIC_RELEASE);
    return refuse("the slot at offset " + std::to_string(offset) + " does not hold " + std::to_string(bytes) + " bytes");
  }
  *words = reinterpret_cast<const capnp::word*>(h + lane_slot_header_bytes);
  return std::shared_ptr<const void>(new taken_slot{shared_from_this(), state_at(h)});
}

} // namespace troupe::net
