#include "net/rejection_log.hpp"

namespace troupe::net {

std::string host_of(const std::string& remote) {
  if (remote.empty()) return "unknown address";
  const std::size_t colon = remote.rfind(':');
  if (colon == std::string::npos || colon == 0) return remote;
  return remote.substr(0, colon);
}

std::string rejection_log::summary(const std::string& address, std::map<std::string, uint64_t>& unlogged) {
  uint64_t n = 0;
  std::string parts;
  for (const auto& [reason, count] : unlogged) {
    n += count;
    parts += (parts.empty() ? "" : ", ") + reason + " " + std::to_string(count);
  }
  unlogged.clear();
  return "refused " + std::to_string(n) + " more from " + address + " (" + parts + ")";
}

std::vector<std::string> rejection_log::add(const rejection& r, clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++totals_[r.reason];
  const std::string address = host_of(r.remote);
  source& s = sources_[address];
  std::vector<std::string> lines;
  if (s.reasons_logged.insert(r.reason).second) {
    lines.push_back("refused: " + r.what);
    if (s.last_line == clock::time_point{}) s.last_line = now;
    return lines;
  }
  ++s.unlogged[r.reason];
  if (now - s.last_line >= interval_) {
    lines.push_back(summary(address, s.unlogged) + " in the last " +
                    std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now - s.last_line).count()) + " s");
    s.last_line = now;
  }
  return lines;
}

std::vector<std::string> rejection_log::flush() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> lines;
  for (auto& [address, s] : sources_)
    if (!s.unlogged.empty()) lines.push_back(summary(address, s.unlogged));
  return lines;
}

std::map<std::string, uint64_t> rejection_log::totals() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return totals_;
}

} // namespace troupe::net
