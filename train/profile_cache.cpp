#include "train/profile_cache.hpp"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "tensor/tensor.hpp"

namespace troupe::train {

namespace {

constexpr const char* magic = "troupe-profile 1";

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  return "unknown cpu";
}

std::optional<std::vector<model::layer_cost>> fail(std::string* why, const std::string& path, const std::string& what) {
  if (why) *why = "profile cache " + path + ": " + what;
  return std::nullopt;
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
  std::ifstream in(path);
  if (!in) return std::nullopt;  // not measured yet
  std::string first, saved_key;
  if (!std::getline(in, first) || first != magic) return fail(why, path, "not a troupe profile (first line)");
  if (!std::getline(in, saved_key)) return fail(why, path, "truncated before its key");
  if (saved_key != key) return std::nullopt;  // another model, batch, thread count or machine
  std::size_t count = 0;
  if (!(in >> count) || count != layers)
    return fail(why, path, "holds " + std::to_string(count) + " layers, the model has " + std::to_string(layers));
  std::vector<model::layer_cost> costs(count);
  for (std::size_t i = 0; i < count; ++i) {
    model::layer_cost& c = costs[i];
    if (!(in >> c.fwd_s >> c.bwd_s >> c.param_bytes >> c.act_bytes))
      return fail(why, path, "truncated or not a number at layer " + std::to_string(i));
    if (!std::isfinite(c.fwd_s) || !std::isfinite(c.bwd_s) || c.fwd_s < 0 || c.bwd_s < 0 || c.param_bytes < 0 ||
        c.act_bytes < 0)
      return fail(why, path, "a negative or non-finite cost at layer " + std::to_string(i));
  }
  return costs;
}

void write_profile(const std::string& path, const std::string& key, const std::vector<model::layer_cost>& costs) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) throw error("--profile-cache: cannot write " + tmp);
    out << magic << "\n" << key << "\n" << costs.size() << "\n";
    out.precision(17);
    for (const model::layer_cost& c : costs)
      out << c.fwd_s << " " << c.bwd_s << " " << c.param_bytes << " " << c.act_bytes << "\n";
    out.flush();
    if (!out) throw error("--profile-cache: cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw error("--profile-cache: cannot rename " + tmp + " to " + path);
  }
}

} // namespace troupe::train
