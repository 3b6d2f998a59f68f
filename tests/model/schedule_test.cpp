// Pipeline schedules as tables.
#include <catch2/catch.hpp>

#include "model/schedule.hpp"
#include "tests/test_util.hpp"

using namespace troupe::model;

namespace {

std::string table(const pipeline_program& p) {
  std::string out;
  for (const auto& a : actions(p)) out += (out.empty() ? "" : " ") + to_string(a);
  return out;
}

} // namespace

TEST_CASE("schedule: GPipe runs every forward, every backward, then one update, per mini-batch", "[model][pipeline]") {
  pipeline_program p(pipeline_schedule::gpipe, 1, 2, 3, 6);
  CHECK(table(p) == "F0 F1 F2 B2 B1 B0 U F3 F4 F5 B5 B4 B3 U");
  CHECK(p.bound() == 3);
  // Every stage runs the same program; a trailing partial mini-batch is not run.
  CHECK(table(pipeline_program(pipeline_schedule::gpipe, 0, 4, 2, 5)) == "F0 F1 B1 B0 U F2 F3 B3 B2 U");
}

TEST_CASE("schedule: 1F1B warms up K-1-k forwards, then alternates, then drains", "[model][pipeline]") {
  // Three stages, five micro-batches (PipeDream's 1F1B with an update after every backward).
  CHECK(table(pipeline_program(pipeline_schedule::one_f_one_b, 0, 3, 1, 5)) ==
        "F0 F1 F2 B0 U F3 B1 U F4 B2 U B3 U B4 U");
  CHECK(table(pipeline_program(pipeline_schedule::one_f_one_b, 1, 3, 1, 5)) ==
        "F0 F1 B0 U F2 B1 U F3 B2 U F4 B3 U B4 U");
  CHECK(table(pipeline_program(pipeline_schedule::one_f_one_b, 2, 3, 1, 5)) ==
        "F0 B0 U F1 B1 U F2 B2 U F3 B3 U F4 B4 U");
  CHECK(pipeline_program(pipeline_schedule::one_f_one_b, 0, 3, 1, 5).bound() == 3);
  CHECK(pipeline_program(pipeline_schedule::one_f_one_b, 2, 3, 1, 5).bound() == 1);
  // Fewer micro-batches than the warm-up: every forward, then every backward.
  CHECK(table(pipeline_program(pipeline_schedule::one_f_one_b, 0, 4, 1, 2)) == "F0 F1 B0 U B1 U");
}

TEST_CASE("schedule: every program forwards and backwards each micro-batch once, forward first", "[model][pipeline]") {
  for (auto s : {pipeline_schedule::gpipe, pipeline_schedule::one_f_one_b})
    for (int k = 1; k <= 4; ++k)
      for (int stage = 0; stage < k; ++stage) {
        INFO(to_string(s) << " stage " << stage << " of " << k);
        const int64_t total = 12;
        pipeline_program p(s, stage, k, 3, total);
        std::vector<int> state(total, 0);  // 0: not yet, 1: forwarded, 2: backwarded
        int in_flight = 0, most = 0;
        for (const auto& a : actions(p)) {
          if (a.what == pipeline_action::kind::forward) {
            CHECK(state[a.micro_batch] == 0);
            state[a.micro_batch] = 1;
            most = std::max(most, ++in_flight);
          } else if (a.what == pipeline_action::kind::backward) {
            CHECK(state[a.micro_batch] == 1);
            state[a.micro_batch] = 2;
            --in_flight;
          }
        }
        for (int x : state) CHECK(x == 2);
        CHECK(most == p.bound());
      }
  CHECK_THROWS_AS(pipeline_program(pipeline_schedule::gpipe, 2, 2, 1, 4), troupe::error);
  CHECK_THROWS_AS(pipeline_program(pipeline_schedule::gpipe, 0, 2, 0, 4), troupe::error);
}

TEST_CASE("schedule: 1F1B drains at its flush points, and each part is a 1F1B program of its own",
          "[model][pipeline]") {
  using k = pipeline_action::kind;
  // Three stages, 7 micro-batches, a flush after the 4th: parts of 4 and 3.
  CHECK(table(pipeline_program(pipeline_schedule::one_f_one_b, 0, 3, 1, 7, {4})) ==
        "F0 F1 F2 B0 U F3 B1 U B2 U B3 U F4 F5 F6 B4 U B5 U B6 U");
  CHECK(table(pipeline_program(pipeline_schedule::one_f_one_b, 2, 3, 1, 7, {4})) ==
        "F0 B0 U F1 B1 U F2 B2 U F3 B3 U F4 B4 U F5 B5 U F6 B6 U");
  for (int stage = 0; stage < 4; ++stage) {
    INFO("stage " << stage << " of 4");
    const std::vector<int64_t> flush{8, 9, 20};
    pipeline_program p(pipeline_schedule::one_f_one_b, stage, 4, 2, 24, flush);
    // Nothing after a flush point is forwarded before everything up to it is backwarded and updated.
    int64_t backwarded = 0, updates = 0;
    for (const auto& a : actions(p)) {
      if (a.what == k::backward) ++backwarded;
      if (a.what == k::update) ++updates;
      if (a.what != k::forward) continue;
      for (int64_t f : flush)
        if (a.micro_batch >= f) CHECK((backwarded >= f && updates >= f));
    }
    CHECK(backwarded == 24);
    CHECK(updates == 24);
  }
  CHECK_THROWS_WITH(pipeline_program(pipeline_schedule::one_f_one_b, 0, 2, 1, 6, {3, 3}),
                    Catch::Contains("flush point 3 after 3 of 6"));
  CHECK_THROWS_AS(pipeline_program(pipeline_schedule::one_f_one_b, 0, 2, 1, 6, {6}), troupe::error);
  CHECK_THROWS_AS(pipeline_program(pipeline_schedule::one_f_one_b, 0, 2, 1, 6, {0}), troupe::error);
}
