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

std::vector<shape> param_layout::range_shapes(const shard_range& r) const {
  std::vector<shape> out;
  for (std::size_t i = r.first; i < r.last; ++i) {
    const tensor_part p = part_of(*this, i, r);
    out.push_back(p.whole ? entries_.at(i).dims : shape{p.numel()});
  }
  return out;
}

tensor_part part_of(const param_layout& layout, std::size_t tensor, const shard_range& r) {
  const layout_entry& e = layout[tensor];
  const int64_t begin = std::max(e.offset, r.begin), end = std::min(e.offset + e.numel(), r.end);
  if (end <= begin) return {begin, begin, e.numel() == 0 && r.holds(tensor)};
  return {begin, end, begin == e.offset && end == e.offset + e.numel()};
}

const char* to_string(shard_cut c) {
  switch (c) {
    case shard_cut::tensors: return "tensors";
    case shard_cut::even: return "even";
    case shard_cut::automatic: return "auto";
  }
  return "?";
}

shard_cut parse_shard_cut(const std::string& name) {
  for (shard_cut c : all_shard_cuts())
    if (name == to_string(c)) return c;
  throw error("unknown shard cut '" + name + "' (auto, tensors or even)");
}

const std::vector<shard_cut>& all_shard_cuts() {
  static const std::vector<shard_cut> all{shard_cut::automatic, shard_cut::tensors, shard_cut::even};
  return all;
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

std::vector<std::size_t> contiguous_partition(const std::vector<int64_t>& costs, int parts, const char* what) {
  const int n = static_cast<int>(costs.size());
  if (parts < 1) throw error(std::string(what) + " must be at least 1, got " + std::to_string(parts));
  if (parts > n) throw error(std::string(what) + " " + std::to_string(parts) + " exceeds the " + std::to_string(n) + " items to share");
  // prefix[i]: the cost of items [0, i).
  std::vector<int64_t> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  // best[s][i]: the smallest largest group when items [0, i) form s groups;
  // cut[s][i]: where the last of those groups starts (the earliest best cut).
  constexpr int64_t inf = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> best(parts + 1, std::vector<int64_t>(n + 1, inf));
  std::vector<std::vector<int>> cut(parts + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int s = 1; s <= parts; ++s)
    for (int i = s; i <= n; ++i)
      for (int j = s - 1; j < i; ++j) {
        if (best[s - 1][j] == inf) continue;
        const int64_t worst = std::max(best[s - 1][j], prefix[i] - prefix[j]);
        if (worst < best[s][i]) {
          best[s][i] = worst;
          cut[s][i] = j;
        }
      }
  std::vector<std::size_t> bounds(parts + 1);
  bounds[parts] = static_cast<std::size_t>(n);
  int end = n;
  for (int s = parts; s >= 1; --s) {
    end = cut[s][end];
    bounds[s - 1] = static_cast<std::size_t>(end);
  }
  return bounds;
}

namespace {

// Equal ranges of elements; each range overlaps the tensors [first, last),
// an empty tensor going with the range its offset starts.
std::vector<shard_range> plan_even(const param_layout& layout, int shards) {
  const int64_t n = layout.numel();
  if (shards > n)
    throw error("--shards " + std::to_string(shards) + " exceeds the model's " + std::to_string(n) + " parameters");
  const int64_t align = n >= 16 * int64_t(shards) ? 16 : 1;
  std::vector<shard_range> out;
  std::size_t t = 0;
  for (int s = 0; s < shards; ++s) {
    shard_range r;
    r.begin = s == 0 ? 0 : out.back().end;
    r.end = s + 1 == shards ? n : (n * (s + 1) / shards + align / 2) / align * align;
    auto before = [&](const layout_entry& e) {  // ends before the range (an empty tensor at its start does not)
      return e.offset + e.numel() <= r.begin && !(e.numel() == 0 && e.offset == r.begin);
    };
    while (t < layout.size() && before(layout[t])) ++t;
    r.first = static_cast<uint32_t>(t);
    std::size_t last = t;
    while (last < layout.size() && (layout[last].offset < r.end || s + 1 == shards)) ++last;
    r.last = static_cast<uint32_t>(last);
    out.push_back(r);
  }
  return out;
}

} // namespace

std::string shard_cut_choice::describe() const {
  std::ostringstream os;
  os.precision(2);
  os << std::fixed;
  os << (cut == shard_cut::even ? "cut evenly" : "whole tensors");
  if (imbalance == 0) os << " (more shards than tensors)";
  else if (cut == shard_cut::even) os << " (whole tensors would make the largest shard " << imbalance << "x an even share)";
  else os << " (the largest shard " << imbalance << "x an even share" << (links ? "" : "; one process: no link to balance")
          << ")";
  return os.str();
}

shard_cut_choice choose_shard_cut(const param_layout& layout, int shards, shard_cut asked, bool links) {
  shard_cut_choice c;
  c.links = links;
  if (shards < 1) throw error("--shards must be at least 1, got " + std::to_string(shards));
  if (static_cast<std::size_t>(shards) > layout.size()) {
    c.imbalance = 0;
  } else {
    int64_t largest = 0;
    for (const shard_range& r : plan_shards(layout, shards, shard_cut::tensors)) largest = std::max(largest, r.numel());
    c.imbalance = layout.numel() > 0 ? static_cast<double>(largest) * shards / static_cast<double>(layout.numel()) : 1;
  }
  c.cut = asked != shard_cut::automatic ? asked
          : c.imbalance == 0 || (links && c.imbalance > auto_cut_imbalance) ? shard_cut::even
                                                                            : shard_cut::tensors;
  return c;
}

std::vector<shard_range> plan_shards(const param_layout& layout, int shards, shard_cut cut) {
  const int n = static_cast<int>(layout.size());
  if (shards < 1) throw error("--shards must be at least 1, got " + std::to_string(shards));
  if (cut == shard_cut::automatic) cut = choose_shard_cut(layout, shards, cut).cut;
  if (cut == shard_cut::even) return plan_even(layout, shards);
  if (shards > n)
    throw error("--shards " + std::to_string(shards) + " exceeds the model's " + std::to_string(n) +
                " parameter tensors (a shard holds whole tensors; --shard-cut even cuts them)");
  std::vector<int64_t> sizes;
  for (int i = 0; i < n; ++i) sizes.push_back(layout[i].numel());
  const std::vector<std::size_t> b = contiguous_partition(sizes, shards, "--shards");
  std::vector<shard_range> out;
  for (int s = 0; s < shards; ++s)
    out.push_back({static_cast<uint32_t>(b[s]), static_cast<uint32_t>(b[s + 1]), layout[b[s]].offset,
                   b[s + 1] < layout.size() ? layout[b[s + 1]].offset : layout.numel()});
  return out;
}

} // namespace troupe::model
