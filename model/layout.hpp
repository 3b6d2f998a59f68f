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
  /// "name [shape] @offset; ..." (identifies the layout in errors and checks).
  std::string describe() const;
  bool operator==(const param_layout& o) const;

private:
  std::vector<layout_entry> entries_;
  int64_t numel_ = 0;
};

/// A parameter shard's part of a layout: the whole tensors [first, last), which
/// are the elements [begin, end) of the flat buffer.
struct shard_range {
  uint32_t first = 0, last = 0;
  int64_t begin = 0, end = 0;
  int64_t numel() const { return end - begin; }
  bool holds(std::size_t tensor) const { return tensor >= first && tensor < last; }
};

/// Cuts items of costs `costs` into `parts` contiguous groups so that the
/// costliest group costs as little as it can (the earliest such cut); returns
/// each group's first item, then the number of items (parts + 1 bounds).
/// Throws troupe::error when parts < 1 or exceeds the number of items.
std::vector<std::size_t> contiguous_partition(const std::vector<int64_t>& costs, int parts, const char* what);

/// Cuts `layout` into `shards` contiguous ranges of whole tensors, so that
/// the largest range is as small as it can be (the earliest such cut). Throws
/// troupe::error when `shards` < 1 or exceeds the number of tensors.
std::vector<shard_range> plan_shards(const param_layout& layout, int shards);

} // namespace troupe::model
