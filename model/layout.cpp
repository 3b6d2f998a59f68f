#include "model/layout.hpp"

#include <algorithm>
#include <limits>
#include <sstream>

#include "tensor/error.hpp"

namespace troupe::model {

param_layout::param_layout(const std::vector<std::pair<std::string, shape>>& tensors) {
  for (const auto& [name, dims] : tensors) {
    entries_.push_back({name, dims, numel_});
    numel_ += dims.numel();
  }
}

std::vector<shape> param_layout::shapes(std::size_t first, std::size_t last) const {
  std::vector<shape> out;
  for (std::size_t i = first; i < last; ++i) out.push_back(entries_.at(i).dims);
  return out;
}

std::string param_layout::describe() const {
  std::ostringstream os;
  for (std::size_t i = 0; i < entries_.size(); ++i)
    os << (i ? "; " : "") << entries_[i].name << " " << entries_[i].dims.to_string() << " @" << entries_[i].offset;
  return os.str();
}

bool param_layout::operator==(const param_layout& o) const {
  if (entries_.size() != o.entries_.size()) return false;
  for (std::size_t i = 0; i < entries_.size(); ++i)
    if (entries_[i].name != o.entries_[i].name || entries_[i].dims != o.entries_[i].dims) return false;
  return true;
}

std::vector<shard_range> plan_shards(const param_layout& layout, int shards) {
  const int n = static_cast<int>(layout.size());
  if (shards < 1) throw error("--shards must be at least 1, got " + std::to_string(shards));
  if (shards > n)
    throw error("--shards " + std::to_string(shards) + " exceeds the model's " + std::to_string(n) +
                " parameter tensors (a shard holds whole tensors)");
  // prefix[i]: elements of tensors [0, i).
  std::vector<int64_t> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + layout[i].numel();
  // best[s][i]: the smallest largest range when tensors [0, i) form s ranges;
  // cut[s][i]: where the last of those ranges starts (the earliest best cut).
  constexpr int64_t inf = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> best(shards + 1, std::vector<int64_t>(n + 1, inf));
  std::vector<std::vector<int>> cut(shards + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int s = 1; s <= shards; ++s)
    for (int i = s; i <= n; ++i)
      for (int j = s - 1; j < i; ++j) {
        if (best[s - 1][j] == inf) continue;
        const int64_t worst = std::max(best[s - 1][j], prefix[i] - prefix[j]);
        if (worst < best[s][i]) {
          best[s][i] = worst;
          cut[s][i] = j;
        }
      }
  std::vector<shard_range> out(shards);
  int end = n;
  for (int s = shards; s >= 1; --s) {
    const int begin = cut[s][end];
    out[s - 1] = {static_cast<uint32_t>(begin), static_cast<uint32_t>(end), prefix[begin], prefix[end]};
    end = begin;
  }
  return out;
}

} // namespace troupe::model
