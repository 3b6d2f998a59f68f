#pragma once

// A model's parameters as one declared flat layout, and the placement of that
// layout on parameter shards: pure, tested without any actor.

#include <cstdint>
#include <string>
#include <vector>

#include "tensor/tensor.hpp"

namespace troupe::model {

/// One parameter tensor of a layout.
struct layout_entry {
  std::string name;  ///< e.g. "1.dense.weight"
  shape dims;
  int64_t offset = 0;  ///< first element in the flat buffer
  int64_t numel() const { return dims.numel(); }
};

/// A model's parameters as one flat buffer: each tensor's name, shape and
/// element offset, in model order, one after another.
class param_layout {
public:
  param_layout() = default;
  explicit param_layout(const std::vector<std::pair<std::string, shape>>& tensors);

  const std::vector<layout_entry>& entries() const { return entries_; }
  std::size_t size() const { return entries_.size(); }
  const layout_entry& operator[](std::size_t i) const { return entries_.at(i); }
  /// Elements of all tensors.
  int64_t numel() const { return numel_; }
  /// The shapes of tensors [first, last).
  std::vector<shape> shapes(std::size_t first, std::size_t last) const;
  /// The shapes of a shard's part of each tensor it overlaps (`r.first` to
  /// `r.last`): a whole tensor's own shape, a cut one's part as [elements]
  /// (a range on the wire is described by these: net::require_range).
  std::vector<shape> range_shapes(const struct shard_range& r) const;
  /// "name [shape] @offset; ..." (identifies the layout in errors and checks).
  std::string describe() const;
  bool operator==(const param_layout& o) const;

private:
  std::vector<layout_entry> entries_;
  int64_t numel_ = 0;
};

/// A parameter shard's part of a layout: the elements [begin, end) of the
/// flat buffer, which overlap the tensors [first, last). Cut by whole tensors
/// (shard_cut::tensors) those tensors lie wholly inside; cut evenly
/// (shard_cut::even) the first and the last may be cut, their other elements
/// held by the neighbouring shards.
struct shard_range {
  uint32_t first = 0, last = 0;
  int64_t begin = 0, end = 0;
  int64_t numel() const { return end - begin; }
  bool holds(std::size_t tensor) const { return tensor >= first && tensor < last; }
};

/// The part of one tensor a range holds: elements [begin, end) of the flat
/// buffer; `whole` when that is the whole tensor.
struct tensor_part {
  int64_t begin = 0, end = 0;
  bool whole = true;
  int64_t numel() const { return end - begin; }
};
/// Tensor `tensor`'s part in `r` (empty when they do not overlap).
tensor_part part_of(const param_layout& layout, std::size_t tensor, const shard_range& r);

/// How parameter shards cut the layout: into whole tensors, the largest range
/// as small as it can be (each tensor's values and gradient are read where
/// they arrive), or into equal ranges of elements, a large tensor cut across
/// shards (its part copied into and out of messages), so that every shard's
/// link carries an equal share (as ps-lite slices keys); or `automatic` (the
/// default, "auto"): the one choose_shard_cut() picks for the model.
enum class shard_cut { tensors, even, automatic };
const char* to_string(shard_cut c);
shard_cut parse_shard_cut(const std::string& name);
const std::vector<shard_cut>& all_shard_cuts();

/// Cuts items of costs `costs` into `parts` contiguous groups so that the
/// costliest group costs as little as it can (the earliest such cut); returns
/// each group's first item, then the number of items (parts + 1 bounds).
/// Throws troupe::error when parts < 1 or exceeds the number of items.
std::vector<std::size_t> contiguous_partition(const std::vector<int64_t>& costs, int parts, const char* what);

/// shard_cut::automatic cuts evenly when whole tensors would give the largest
/// shard more than this many times an even share (its link carries that much
/// more each step: docs/benchmarks.md, "The default cut"), else by whole tensors.
constexpr double auto_cut_imbalance = 1.25;

/// What a cut resolves to, and why.
struct shard_cut_choice {
  shard_cut cut = shard_cut::tensors;  ///< tensors or even, never automatic
  /// The largest shard of the whole-tensor cut over an even share (0 when
  /// there are more shards than tensors: no such cut).
  double imbalance = 1;
  bool links = true;  ///< whether the shards' traffic crosses links (false: one process)
  /// "cut evenly (...)" or "whole tensors (...)" with the reason, for the log.
  std::string describe() const;
};
/// `asked` resolved for `layout` and `shards`: tensors and even as they are;
/// automatic to even when there are more shards than tensors, or when the
/// whole-tensor cut's imbalance exceeds auto_cut_imbalance and the shards'
/// traffic crosses `links` (in one process no link is to balance, and cut
/// tensors cost their parts' copies), else tensors.
shard_cut_choice choose_shard_cut(const param_layout& layout, int shards, shard_cut asked, bool links = true);

/// Cuts `layout` into `shards` contiguous ranges. shard_cut::tensors: of whole
/// tensors, so that the largest range is as small as it can be (the earliest
/// such cut); throws troupe::error when `shards` exceeds the number of
/// tensors. shard_cut::even: of equal numbers of elements (bounds at the nearest
/// multiple of 16 when there are at least 16 per shard); throws when `shards` exceeds the
/// number of elements. shard_cut::automatic: as choose_shard_cut() resolves it.
/// Throws when `shards` < 1.
std::vector<shard_range> plan_shards(const param_layout& layout, int shards, shard_cut cut = shard_cut::tensors);

} // namespace troupe::model
