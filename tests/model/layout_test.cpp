// The declared parameter layout, its placement on shards (contiguous ranges
// of whole tensors, the largest as small as it can be), and a model's
// parameters flattened into one value and one gradient buffer.
#include <catch2/catch.hpp>

#include "kernels/kernels.hpp"
#include "model/layout.hpp"
#include "model/nn.hpp"
#include "tests/test_util.hpp"

using namespace troupe;
using troupe::model::param_layout;
using troupe::model::plan_shards;
using troupe::model::shard_range;
using Catch::Matchers::Contains;

namespace {

/// A layout of tensors t0, t1, ... of shape [size].
param_layout sized(const std::vector<int64_t>& sizes) {
  std::vector<std::pair<std::string, shape>> ts;
  for (std::size_t i = 0; i < sizes.size(); ++i) ts.emplace_back("t" + std::to_string(i), shape{sizes[i]});
  return param_layout(ts);
}

struct cut {
  uint32_t first, last;
  int64_t begin, end;
};
void check_ranges(const std::vector<shard_range>& got, const std::vector<cut>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t s = 0; s < want.size(); ++s) {
    INFO("shard " << s);
    CHECK(got[s].first == want[s].first);
    CHECK(got[s].last == want[s].last);
    CHECK(got[s].begin == want[s].begin);
    CHECK(got[s].end == want[s].end);
  }
}

const kernels::context ctx{};

} // namespace

TEST_CASE("param_layout: offsets one after another, shapes of a range, description", "[model][layout]") {
  const param_layout l({{"a", {2, 3}}, {"b", {4}}, {"c", {0}}, {"d", {1, 2, 2}}});
  REQUIRE(l.size() == 4);
  CHECK(l[0].offset == 0);
  CHECK(l[1].offset == 6);
  CHECK(l[2].offset == 10);
  CHECK(l[3].offset == 10);  // after an empty tensor
  CHECK(l[3].numel() == 4);
  CHECK(l.numel() == 14);
  CHECK(l[1].name == "b");
  CHECK(l[3].dims == shape{1, 2, 2});
  CHECK(l.shapes(1, 3) == std::vector<shape>{{4}, {0}});
  CHECK(l.shapes(2, 2).empty());
  CHECK(l.describe() == "a [2, 3] @0; b [4] @6; c [0] @10; d [1, 2, 2] @10");
  CHECK_THROWS(l[4]);
  CHECK(param_layout().numel() == 0);
  // Equal: the same names and shapes in the same order.
  CHECK(l == param_layout({{"a", {2, 3}}, {"b", {4}}, {"c", {0}}, {"d", {1, 2, 2}}}));
  CHECK_FALSE(l == param_layout({{"a", {3, 2}}, {"b", {4}}, {"c", {0}}, {"d", {1, 2, 2}}}));
  CHECK_FALSE(l == param_layout({{"a", {2, 3}}, {"x", {4}}, {"c", {0}}, {"d", {1, 2, 2}}}));
  CHECK_FALSE(l == param_layout({{"a", {2, 3}}, {"b", {4}}, {"c", {0}}}));
  const shard_range r{1, 3, 6, 10};
  CHECK(r.numel() == 4);
  CHECK(r.holds(1));
  CHECK(r.holds(2));
  CHECK_FALSE(r.holds(0));
  CHECK_FALSE(r.holds(3));
}

TEST_CASE("plan_shards: contiguous cuts of whole tensors that minimise the largest range", "[model][layout]") {
  // {10, 3, 7, 5} into 2: {10 | 3 7 5} = 15, {10 3 | 7 5} = 13, {10 3 7 | 5} = 20: the middle cut.
  check_ranges(plan_shards(sized({10, 3, 7, 5}), 2), {{0, 2, 0, 13}, {2, 4, 13, 25}});
  // {1, 2, 3, 4, 5} into 2: {1 2 3 | 4 5} = 9 beats {1 2 3 4 | 5} = 10 (greedy filling to 7.5 would not find it).
  check_ranges(plan_shards(sized({1, 2, 3, 4, 5}), 2), {{0, 3, 0, 6}, {3, 5, 6, 15}});
  // Into 3: {1 2 3 | 4 | 5} = 6 is the only cut with a largest range of 6.
  check_ranges(plan_shards(sized({1, 2, 3, 4, 5}), 3), {{0, 3, 0, 6}, {3, 4, 6, 10}, {4, 5, 10, 15}});
  // One large tensor bounds the answer: {1 1 1 | 9} = 9.
  check_ranges(plan_shards(sized({1, 1, 1, 9}), 2), {{0, 3, 0, 3}, {3, 4, 3, 12}});
}

TEST_CASE("plan_shards: among the best cuts, the earliest, 1 shard, one tensor per shard, errors", "[model][layout]") {
  // Ties: {5 | 5 5} and {5 5 | 5} both have 10; the last range starts as early as it can.
  check_ranges(plan_shards(sized({5, 5, 5}), 2), {{0, 1, 0, 5}, {1, 3, 5, 15}});
  // {1 1 1 1} into 3: the largest range holds 2 wherever it is; it goes last.
  check_ranges(plan_shards(sized({1, 1, 1, 1}), 3), {{0, 1, 0, 1}, {1, 2, 1, 2}, {2, 4, 2, 4}});
  // {2, 8, 3, 3, 3, 1} into 3: every best cut has 10 (the 8 with the 2, or the 8 alone and
  // 3 3 3 1 after it); the earliest puts 2 and 8 alone.
  check_ranges(plan_shards(sized({2, 8, 3, 3, 3, 1}), 3), {{0, 1, 0, 2}, {1, 2, 2, 10}, {2, 6, 10, 20}});
  // One shard holds everything.
  check_ranges(plan_shards(sized({4, 0, 6}), 1), {{0, 3, 0, 10}});
  // As many shards as tensors: one each, an empty one included.
  check_ranges(plan_shards(sized({4, 0, 6}), 3), {{0, 1, 0, 4}, {1, 2, 4, 4}, {2, 3, 4, 10}});
  check_ranges(plan_shards(sized({4, 4, 4}), 3), {{0, 1, 0, 4}, {1, 2, 4, 8}, {2, 3, 8, 12}});
  CHECK_THROWS_MATCHES(plan_shards(sized({1, 2}), 3), troupe::error,
                       testing::message(Contains("--shards 3 exceeds the model's 2 parameter tensors")));
  CHECK_THROWS_MATCHES(plan_shards(sized({1, 2}), 0), troupe::error,
                       testing::message(Contains("--shards must be at least 1, got 0")));
  CHECK_THROWS_AS(plan_shards(sized({1, 2}), -1), troupe::error);
  CHECK_THROWS_AS(plan_shards(param_layout(), 1), troupe::error);
}

TEST_CASE("plan_shards, even cut: equal ranges of elements, tensors cut across shards, their parts", "[model][layout]") {
  using model::shard_cut;
  // 40 elements in 4 shards: 10 each (fewer than 16 per shard: bounds not aligned).
  const param_layout l = sized({24, 12, 4});
  check_ranges(plan_shards(l, 4, shard_cut::even), {{0, 1, 0, 10}, {0, 1, 10, 20}, {0, 2, 20, 30}, {1, 3, 30, 40}});
  const auto r = plan_shards(l, 4, shard_cut::even);
  // Shard 2 holds the tail of t0 and the head of t1: both cut, each described as [elements].
  CHECK(l.range_shapes(r[2]) == std::vector<shape>{{4}, {6}});
  const model::tensor_part p = model::part_of(l, 0, r[2]);
  CHECK(p.begin == 20);
  CHECK(p.end == 24);
  CHECK_FALSE(p.whole);
  CHECK(model::part_of(l, 2, r[3]).whole);
  CHECK(model::part_of(l, 2, r[3]).numel() == 4);
  CHECK(l.range_shapes(r[3]) == std::vector<shape>{{6}, {4}});
  // Every element in exactly one shard, in order.
  int64_t at = 0;
  for (const auto& x : r) {
    CHECK(x.begin == at);
    at = x.end;
  }
  CHECK(at == l.numel());
  // At least 16 per shard: bounds on multiples of 16; more shards than tensors is fine.
  const param_layout big = sized({1000, 7});
  const auto b = plan_shards(big, 3, shard_cut::even);
  check_ranges(b, {{0, 1, 0, 336}, {0, 1, 336, 672}, {0, 2, 672, 1007}});
  CHECK(big.range_shapes(b[2]) == std::vector<shape>{{328}, {7}});
  // Whole tensors keep their shapes; a whole-tensor cut's range_shapes are its shapes.
  const auto w = plan_shards(l, 2);
  CHECK(l.range_shapes(w[1]) == l.shapes(w[1].first, w[1].last));
  // An empty tensor goes with the range its offset starts; the last range takes those at the end.
  const auto e = plan_shards(sized({4, 0, 4, 0}), 2, shard_cut::even);
  check_ranges(e, {{0, 1, 0, 4}, {1, 4, 4, 8}});
  CHECK(sized({4, 0, 4, 0}).range_shapes(e[1]) == std::vector<shape>{{0}, {4}, {0}});
  CHECK_THROWS_MATCHES(plan_shards(sized({1, 2}), 4, shard_cut::even), troupe::error,
                       testing::message(Contains("--shards 4 exceeds the model's 3 parameters")));
  CHECK(model::parse_shard_cut("even") == shard_cut::even);
  CHECK_THROWS_AS(model::parse_shard_cut("rows"), troupe::error);
}

TEST_CASE("choose_shard_cut: auto cuts evenly where whole tensors leave one shard too large", "[model][layout]") {
  using model::choose_shard_cut;
  using model::shard_cut;
  // One tensor of 85 %: whole tensors give 2 shards 170 and 30 of 200, 1.70x an even share.
  const param_layout dominant = sized({170, 10, 10, 10});
  auto c = choose_shard_cut(dominant, 2, shard_cut::automatic);
  CHECK(c.cut == shard_cut::even);
  CHECK(c.imbalance == Approx(1.70));
  CHECK(c.describe() == "cut evenly (whole tensors would make the largest shard 1.70x an even share)");
  CHECK(plan_shards(dominant, 2, shard_cut::automatic)[0].end == 96);  // cut evenly (at multiples of 16)
  // Balanced: whole tensors, whose largest shard is at most 1.25x an even share (5 of 4 here).
  const param_layout balanced = sized({4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4});
  c = choose_shard_cut(balanced, 5, shard_cut::automatic);
  CHECK(c.cut == shard_cut::tensors);
  CHECK(c.imbalance == Approx(12.0 / 48 * 5));  // 3 tensors of 12, 1.25x: not over the line
  CHECK(c.describe() == "whole tensors (the largest shard 1.25x an even share)");
  c = choose_shard_cut(balanced, 7, shard_cut::automatic);  // 2 tensors of 12 on the largest: 1.17x
  CHECK(c.cut == shard_cut::tensors);
  c = choose_shard_cut(balanced, 9, shard_cut::automatic);  // 2 of 12 again, but an even share is 5.33: 1.5x
  CHECK(c.cut == shard_cut::even);
  // More shards than tensors: only an even cut exists.
  c = choose_shard_cut(dominant, 5, shard_cut::automatic);
  CHECK(c.cut == shard_cut::even);
  CHECK(c.imbalance == 0);
  CHECK(c.describe() == "cut evenly (more shards than tensors)");
  // Asked for, a cut is kept; the imbalance is still reported.
  CHECK(choose_shard_cut(dominant, 2, shard_cut::tensors).cut == shard_cut::tensors);
  CHECK(choose_shard_cut(balanced, 5, shard_cut::even).cut == shard_cut::even);
  CHECK(choose_shard_cut(dominant, 1, shard_cut::automatic).cut == shard_cut::tensors);  // one shard: 1x
  CHECK_THROWS_AS(choose_shard_cut(dominant, 0, shard_cut::automatic), troupe::error);
  // In one process no link is to balance: whole tensors (cut ones would only add copies), unless there are more
  // shards than tensors; asked for, even stays even.
  c = choose_shard_cut(dominant, 2, shard_cut::automatic, false);
  CHECK(c.cut == shard_cut::tensors);
  CHECK(c.describe() == "whole tensors (the largest shard 1.70x an even share; one process: no link to balance)");
  CHECK(choose_shard_cut(dominant, 5, shard_cut::automatic, false).cut == shard_cut::even);
  CHECK(choose_shard_cut(dominant, 2, shard_cut::even, false).cut == shard_cut::even);
  CHECK(model::parse_shard_cut("auto") == shard_cut::automatic);
  CHECK(std::string(model::to_string(shard_cut::automatic)) == "auto");
}

TEST_CASE("model::layout names every parameter with its shape and offset, in model order", "[model][layout]") {
  model::model m = nn::sequential(nn::dense(3, 4), nn::relu(), nn::dense(4, 2));
  m.build({3}, 1);
  const param_layout l = m.layout();
  REQUIRE(l.size() == 4);
  CHECK(l[0].name == "0.dense.weight");
  CHECK(l[0].dims == shape{4, 3});
  CHECK(l[0].offset == 0);
  CHECK(l[1].name == "0.dense.bias");
  CHECK(l[1].offset == 12);
  CHECK(l[2].name == "2.dense.weight");
  CHECK(l[2].dims == shape{2, 4});
  CHECK(l[2].offset == 16);
  CHECK(l[3].name == "2.dense.bias");
  CHECK(l[3].offset == 24);
  CHECK(l.numel() == 26);
  CHECK(l.numel() == m.num_parameters());
  // A second model of the same architecture has the same layout.
  model::model same = nn::sequential(nn::dense(3, 4), nn::relu(), nn::dense(4, 2));
  same.build({3}, 9);
  CHECK(same.layout() == l);
}

TEST_CASE("flatten: parameters become views of one value and one gradient buffer, training is unchanged",
          "[model][layout]") {
  auto make = [] {
    model::model m = nn::sequential(nn::conv2d(1, 2, 3).padding(1), nn::relu(), nn::flatten(), nn::dense(32, 3));
    m.build({1, 4, 4}, 7);
    return m;
  };
  model::model plain = make();
  model::model flat = make();
  const param_layout l = flat.layout();
  std::vector<float> before;
  for (auto* p : flat.parameters()) {
    auto v = p->value.to_vector();
    before.insert(before.end(), v.begin(), v.end());
  }
  model::model::flat_buffers buf = flat.flatten();
  REQUIRE(buf.values.numel() == l.numel());
  REQUIRE(buf.grads.numel() == l.numel());
  CHECK(buf.values.to_vector() == before);  // values kept, in layout order
  CHECK(flat.layout() == l);
  auto ps = flat.parameters();
  for (std::size_t i = 0; i < ps.size(); ++i) {
    INFO(ps[i]->name);
    CHECK(ps[i]->value.shape() == l[i].dims);
    CHECK(ps[i]->value.shares_storage(buf.values));
    CHECK(ps[i]->grad.shares_storage(buf.grads));
    CHECK(ps[i]->value.data() == buf.values.data() + l[i].offset);
    CHECK(ps[i]->grad.data() == buf.grads.data() + l[i].offset);
  }
  // Write through the buffer, read through the parameter; and back.
  const float saved = buf.values.at(l[3].offset + 1);
  buf.values.at(l[3].offset + 1) = 42.0f;
  CHECK(ps[3]->value.at(1) == 42.0f);
  ps[3]->value.at(1) = saved;
  CHECK(buf.values.at(l[3].offset + 1) == saved);

  // The same forward and backward on both models: the same loss and gradients,
  // the flat model's in its gradient buffer.
  std::vector<float> xs(2 * 16);
  for (std::size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>((i * 7) % 11) / 5.0f - 1.0f;
  const tensor x = tensor::from({2, 1, 4, 4}, xs);
  const std::vector<int32_t> labels{2, 0};
  tensor d1, d2;
  const float loss1 = kernels::softmax_cross_entropy(ctx, plain.forward(ctx, x, true), labels, &d1);
  const float loss2 = kernels::softmax_cross_entropy(ctx, flat.forward(ctx, x, true), labels, &d2);
  CHECK(loss2 == Approx(loss1).epsilon(1e-6));
  plain.backward(ctx, d1);
  flat.backward(ctx, d2);
  auto pp = plain.parameters();
  for (std::size_t i = 0; i < pp.size(); ++i) {
    INFO(pp[i]->name);
    const std::vector<float> g = pp[i]->grad.to_vector();
    REQUIRE(ps[i]->grad.numel() == static_cast<int64_t>(g.size()));
    // Summation order may differ with the buffers' alignment: equal up to rounding.
    for (std::size_t j = 0; j < g.size(); ++j) CHECK(buf.grads.at(l[i].offset + j) == Approx(g[j]).margin(1e-6));
    CHECK(ps[i]->grad.shares_storage(buf.grads));  // backward wrote into the buffer, not a new tensor
  }
  bool any_nonzero = false;
  for (float g : buf.grads.to_vector()) any_nonzero |= g != 0.0f;
  CHECK(any_nonzero);
}
