#include "train/profile_cache.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "tensor/tensor.hpp"

namespace troupe::train {

namespace {

// Version 2 holds several entries, one per key; version 1 (one entry) reads the same way.
constexpr const char* magic = "troupe-profile 2";
constexpr const char* magic_v1 = "troupe-profile 1";
/// The most entries a file keeps: the oldest goes when a new key comes.
constexpr std::size_t max_entries = 32;

struct entry {
  std::string key;
  std::vector<model::layer_cost> costs;
};

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  return "unknown cpu";
}

/// Nothing, with why the file at `path` cannot be used in `why`.
std::nullopt_t fail(std::string* why, const std::string& path, const std::string& what) {
  if (why) *why = "profile cache " + path + ": " + what;
  return std::nullopt;
}

/// One entry's costs, after its key line; a reason in `why` when unreadable.
bool read_costs(std::istream& in, std::vector<model::layer_cost>& costs, std::string& why) {
  std::size_t count = 0;
  if (!(in >> count) || count > (std::size_t(1) << 20)) {
    why = "truncated or not a layer count";
    return false;
  }
  costs.assign(count, {});
  for (std::size_t i = 0; i < count; ++i) {
    model::layer_cost& c = costs[i];
    if (!(in >> c.fwd_s >> c.bwd_s >> c.param_bytes >> c.act_bytes)) {
      why = "truncated or not a number at layer " + std::to_string(i);
      return false;
    }
    if (!std::isfinite(c.fwd_s) || !std::isfinite(c.bwd_s) || c.fwd_s < 0 || c.bwd_s < 0 || c.param_bytes < 0 ||
        c.act_bytes < 0) {
      why = "a negative or non-finite cost at layer " + std::to_string(i);
      return false;
    }
  }
  return true;
}

/// Every entry of `path`, in the order written: none for a missing file;
/// nothing, with the reason in `why`, for a file that is not a profile.
std::optional<std::vector<entry>> read_entries(const std::string& path, std::string* why) {
  std::vector<entry> out;
  std::ifstream in(path);
  if (!in) return out;  // not measured yet
  std::string first, what;
  if (!std::getline(in, first) || (first != magic && first != magic_v1)) what = "not a troupe profile (first line)";
  for (entry e; what.empty() && std::getline(in >> std::ws, e.key);) {
    if (!read_costs(in, e.costs, what)) break;
    out.push_back(std::move(e));
  }
  if (what.empty() && out.empty()) what = "truncated before its key";
  if (!what.empty()) return fail(why, path, what);
  return out;
}

} // namespace

std::string profile_key(const std::string& architecture, const std::string& measured_for) {
  // One line: the architecture's own line breaks would end the key early.
  std::string key = architecture + " | " + measured_for + " | " + cpu_model();
  for (char& c : key)
    if (c == '\n' || c == '\r') c = ' ';
  return key;
}

std::optional<std::vector<model::layer_cost>> read_profile(const std::string& path, const std::string& key,
                                                           std::size_t layers, std::string* why) {
  if (why) why->clear();
  std::optional<std::vector<entry>> entries = read_entries(path, why);
  if (!entries) return std::nullopt;
  for (entry& e : *entries) {
    if (e.key != key) continue;
    if (e.costs.size() != layers)
      return fail(why, path,
                  "holds " + std::to_string(e.costs.size()) + " layers, the model has " + std::to_string(layers));
    return std::move(e.costs);
  }
  return std::nullopt;  // another model, batch, thread count or machine
}

void write_profile(const std::string& path, const std::string& key, const std::vector<model::layer_cost>& costs) {
  // The other keys' entries stay (a file that cannot be read is replaced);
  // this key's goes last, and the oldest go beyond max_entries.
  std::vector<entry> entries = read_entries(path, nullptr).value_or(std::vector<entry>{});
  entries.erase(std::remove_if(entries.begin(), entries.end(), [&](const entry& e) { return e.key == key; }),
                entries.end());
  entries.push_back({key, costs});
  if (entries.size() > max_entries) entries.erase(entries.begin(), entries.end() - max_entries);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) throw error("--profile-cache: cannot write " + tmp);
    out << magic << "\n";
    out.precision(17);
    for (const entry& e : entries) {
      out << e.key << "\n" << e.costs.size() << "\n";
      for (const model::layer_cost& c : e.costs)
        out << c.fwd_s << " " << c.bwd_s << " " << c.param_bytes << " " << c.act_bytes << "\n";
    }
    out.flush();
    if (!out) throw error("--profile-cache: cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw error("--profile-cache: cannot rename " + tmp + " to " + path);
  }
}

} // namespace troupe::train
