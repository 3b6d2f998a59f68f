// The placer's measured layer costs are kept by the caller (train::cost_cache),
// not by the process: jobs given one cache measure a model once; jobs without
// one measure each time.
#include <catch2/catch.hpp>

#include <atomic>
#include <string>

#include "actors/fit.hpp"
#include "model/zoo.hpp"
#include "tests/test_util.hpp"
#include "train/profile_cache.hpp"

using namespace troupe;

namespace {

job placed_pipeline(const std::string& data_dir) {
  return job()
      .model([] { return zoo::mlp(); }, "mlp")
      .data(data::idx_dir(data_dir))
      .batch_size(32)
      .threads(1)
      .pipeline(2)
      .placement(placement_kind::greedy, {1, 2});
}

} // namespace

TEST_CASE("cost cache: keys are measured once, whoever asks", "[train][plan]") {
  train::cost_cache cache;
  int measured = 0;
  auto measure = [&] {
    ++measured;
    return std::vector<model::layer_cost>{{1e-3, 2e-3, 0, 0}};
  };
  CHECK(cache.get("a", measure).size() == 1);
  CHECK(cache.get("a", measure).size() == 1);
  CHECK(cache.get("b", measure).size() == 1);
  CHECK(measured == 2);
  CHECK(cache.size() == 2);
}

TEST_CASE("cost cache: jobs given one cache place on the same measured costs", "[train][plan]") {
  testing::temp_dir dir{"troupe_costs"};
  testing::write_dataset(dir.path());
  auto cache = std::make_shared<train::cost_cache>();
  const std::string first = describe_plan(placed_pipeline(dir.path()).cost_cache(cache), true);
  CHECK(cache->size() == 1);
  const std::string second = describe_plan(placed_pipeline(dir.path()).cost_cache(cache), true);
  CHECK(cache->size() == 1);
  CHECK(first == second);  // the same costs, so the same placement and prediction
  // Another micro-batch is another key.
  (void)describe_plan(placed_pipeline(dir.path()).batch_size(64).cost_cache(cache), true);
  CHECK(cache->size() == 2);
}

TEST_CASE("troupe_plan's description of a data-parallel job predicts its step on its links", "[train][plan][scaling]") {
  testing::temp_dir dir{"troupe_scaling_plan"};
  testing::write_dataset(dir.path());
  auto dp = [&](algorithm a, std::vector<float> link) {
    job j = job().model([] { return zoo::mlp(); }, "mlp").data(data::idx_dir(dir.path())).batch_size(32).threads(1);
    j.algorithm(a.workers(4));
    settings s = j.config();
    s.pipeline.link_cost = std::move(link);
    j.configure(s);
    return describe_plan(j, false);
  };
  const std::string slow = dp(allreduce(), {4e-8f, 5e-5f}), fast = dp(allreduce(), {1e-10f, 1e-6f});
  CHECK_THAT(slow, Catch::Contains("predicted step") && Catch::Contains("links of --link-cost"));
  // The MLP's 0.9 MB through 200 Mbit/s links: communication dominates; on fast links it does not.
  auto efficiency = [](const std::string& d) { return std::stoi(d.substr(d.rfind("efficiency ") + 11)); };
  CHECK(efficiency(slow) < 20);
  CHECK(efficiency(fast) > efficiency(slow));
  CHECK_THAT(dp(ssgd().shards(2), {}), Catch::Contains("links of one process"));
  // Shards: the other cut too. The MLP's first matrix on one shard's link: cut evenly, less communication.
  auto comm = [](const std::string& d, const std::string& after) {
    const std::size_t at = d.find(after);
    return std::stod(d.substr(d.find("ms, of which ", at) + 13));
  };
  const std::string whole = dp(asgd().shards(4).shard_cut(model::shard_cut::tensors), {4e-8f, 5e-5f});
  CHECK_THAT(whole, Catch::Contains("with --shard-cut even: "));
  CHECK(comm(whole, "with --shard-cut even") < 0.7 * comm(whole, "predicted step"));
  CHECK_THAT(dp(asgd().shards(4).shard_cut(model::shard_cut::even), {4e-8f, 5e-5f}),
             Catch::Contains("with --shard-cut tensors: "));
  // The default (auto) in one process keeps whole tensors (no link to balance) and predicts the even cut too.
  const std::string automatic = dp(asgd().shards(4), {4e-8f, 5e-5f});
  CHECK_THAT(automatic, Catch::Contains("shards: whole tensors (the largest shard 3.41x an even share; one process"));
  CHECK_THAT(automatic, Catch::Contains("with --shard-cut even: "));
  CHECK_THAT(dp(allreduce(), {4e-8f, 5e-5f}), !Catch::Contains("--shard-cut"));
  CHECK_THAT(dp(hogwild(), {}), !Catch::Contains("predicted step"));  // one shared buffer: no links
  // bf16 halves what an allreduce sends; shards take float32 whatever --allreduce-dtype says.
  const double f32 = comm(dp(allreduce(), {4e-8f, 0}), "predicted step");
  CHECK(comm(dp(allreduce().allreduce_dtype(reduce_dtype::bf16), {4e-8f, 0}), "predicted step") ==
        Approx(f32 / 2).epsilon(0.05));
  const double shards = comm(dp(ssgd().shards(4), {4e-8f, 0}), "predicted step");
  CHECK(comm(dp(ssgd().shards(4).allreduce_dtype(reduce_dtype::bf16), {4e-8f, 0}), "predicted step") ==
        Approx(shards).epsilon(0.05));
}
