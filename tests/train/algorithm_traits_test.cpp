// The algorithm table: every algorithm declared once, with what the plan, the
// runtime and the coordinator ask of it.
#include <catch2/catch.hpp>

#include <set>
#include <string>

#include "train/job.hpp"

using namespace troupe;

TEST_CASE("algorithm traits: one row per algorithm, names unique and parsed back", "[train][algorithms]") {
  std::set<std::string> names;
  for (algorithm_kind k : all_algorithms()) {
    const algorithm_traits& t = traits(k);
    INFO(t.name);
    CHECK(t.kind == k);
    CHECK(names.insert(t.name).second);
    CHECK(std::string(to_string(k)) == t.name);
    CHECK((t.make != nullptr) == t.shards);  // a rule exactly where shards apply one
    CHECK_FALSE((t.shards && t.shared_memory));  // parameters live in one place
    CHECK(t.survives_lost_workers() == (t.on_actors && (!t.synchronous || t.collective)));  // an allreduce re-forms its group
  }
  CHECK(names.size() == 9);
}

TEST_CASE("algorithm traits: the special cases are traits, not names", "[train][algorithms]") {
  CHECK_FALSE(traits(algorithm_kind::sequential).on_actors);
  CHECK(traits(algorithm_kind::ssgd).synchronous);
  CHECK_FALSE(traits(algorithm_kind::ssgd).survives_lost_workers());
  CHECK_FALSE(traits(algorithm_kind::ssgd).retries_pulls());
  CHECK(traits(algorithm_kind::hogwild).shared_memory);
  CHECK_FALSE(traits(algorithm_kind::hogwild).shards);
  for (algorithm_kind k : {algorithm_kind::asgd, algorithm_kind::sa_asgd, algorithm_kind::dc_asgd_c,
                           algorithm_kind::dc_asgd_a, algorithm_kind::ddc_asgd}) {
    CHECK(traits(k).shards);
    CHECK(traits(k).survives_lost_workers());
    CHECK(traits(k).retries_pulls());
  }
}
