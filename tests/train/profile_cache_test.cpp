// The layers' costs kept across processes (--profile-cache): read back as
// written, nothing for another key or a missing file, and a file that is not
// a profile is measured again with a reason, never trusted.
#include <catch2/catch.hpp>

#include <fstream>
#include <iterator>

#include "tests/test_util.hpp"
#include "train/profile_cache.hpp"

using namespace troupe;
using Catch::Matchers::Contains;

namespace {

std::vector<model::layer_cost> some_costs() {
  return {{1.5e-4, 3.25e-4, 1152, 100352}, {2e-6, 0, 0, 100352}, {1e-3, 2.0000001e-3, 1605632, 512}};
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

} // namespace

TEST_CASE("a profile is read back as written, under its key only", "[train][placement]") {
  testing::temp_dir dir;
  const std::string path = dir.file("costs.txt");
  const std::string key = train::profile_key("conv2d(1,32,3) relu\nmax_pool2d(2)", "16x4|1");
  CHECK(key.find('\n') == std::string::npos);
  std::string why;
  CHECK_FALSE(train::read_profile(path, key, 3, &why));  // not measured yet
  CHECK(why.empty());
  train::write_profile(path, key, some_costs());
  const auto back = train::read_profile(path, key, 3, &why);
  REQUIRE(back);
  CHECK(why.empty());
  const auto expected = some_costs();
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK((*back)[i].fwd_s == expected[i].fwd_s);
    CHECK((*back)[i].bwd_s == expected[i].bwd_s);
    CHECK((*back)[i].param_bytes == expected[i].param_bytes);
    CHECK((*back)[i].act_bytes == expected[i].act_bytes);
  }
  // Another model, batch or thread count: measured again, silently.
  CHECK_FALSE(train::read_profile(path, train::profile_key("conv2d(1,32,3)", "32x4|1"), 3, &why));
  CHECK(why.empty());
}

TEST_CASE("a file that is not a profile is measured again, with the reason", "[train][placement]") {
  testing::temp_dir dir;
  const std::string path = dir.file("costs.txt");
  const std::string key = train::profile_key("mlp", "64x1|1");
  train::write_profile(path, key, some_costs());
  std::string why;
  CHECK_FALSE(train::read_profile(path, key, 4, &why));
  CHECK_THAT(why, Contains("holds 3 layers, the model has 4"));
  const std::string head = "troupe-profile 1\n" + key + "\n3\n";
  const std::pair<std::string, std::string> bad[] = {
      {"garbage\n", "not a troupe profile"},
      {"troupe-profile 1\n", "truncated before its key"},
      {head + "1e-4 2e-4 10 10\n1e-4 x 10 10\n", "not a number at layer 1"},
      {head + "1e-4 2e-4 10 10\n", "truncated or not a number at layer 1"},
      {head + "1e-4 2e-4 10 10\n1e-4 -2e-4 10 10\n1 1 1 1\n", "negative or non-finite cost at layer 1"},
      {head + "1e-4 2e-4 10 10\n1e-4 nan 10 10\n1 1 1 1\n", "at layer 1"},
  };
  for (const auto& [text, reason] : bad) {
    INFO(text);
    write_text(path, text);
    CHECK_FALSE(train::read_profile(path, key, 3, &why));
    CHECK_THAT(why, Contains(reason));
  }
}

TEST_CASE("a profile that cannot be written is an error naming the file", "[train][placement]") {
  CHECK_THROWS_WITH(train::write_profile("/nonexistent-dir/costs.txt", "k", some_costs()),
                    Contains("/nonexistent-dir/costs.txt"));
}

TEST_CASE("a profile file keeps one entry per key, the oldest dropped beyond 32", "[train][placement]") {
  testing::temp_dir dir;
  const std::string path = dir.file("costs.txt");
  auto costs_of = [](int i) {
    auto c = some_costs();
    c[0].fwd_s = 1e-4 * (i + 1);
    return c;
  };
  auto key_of = [](int i) { return train::profile_key("model " + std::to_string(i), "64x4|1"); };
  // Two jobs taking turns (troupe_plan's key, then the trainer's): neither measures again.
  train::write_profile(path, key_of(0), costs_of(0));
  train::write_profile(path, key_of(1), costs_of(1));
  std::string why;
  for (int i : {0, 1}) {
    const auto back = train::read_profile(path, key_of(i), 3, &why);
    REQUIRE(back);
    CHECK((*back)[0].fwd_s == costs_of(i)[0].fwd_s);
  }
  // A key written again replaces its entry, the others stay.
  train::write_profile(path, key_of(0), costs_of(7));
  CHECK((*train::read_profile(path, key_of(0), 3, &why))[0].fwd_s == costs_of(7)[0].fwd_s);
  CHECK((*train::read_profile(path, key_of(1), 3, &why))[0].fwd_s == costs_of(1)[0].fwd_s);
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text.find(key_of(0)) == text.rfind(key_of(0)));  // once
  // Beyond 32 keys the oldest go: key 1 (written before key 0's rewrite) first.
  for (int i = 2; i < 33; ++i) train::write_profile(path, key_of(i), costs_of(i));
  CHECK_FALSE(train::read_profile(path, key_of(1), 3, &why));
  CHECK(why.empty());
  CHECK(train::read_profile(path, key_of(0), 3, &why));
  CHECK(train::read_profile(path, key_of(32), 3, &why));
}

TEST_CASE("a profile file of version 1 (one entry) is read, and kept when another key is added",
          "[train][placement]") {
  testing::temp_dir dir;
  const std::string path = dir.file("costs.txt");
  const std::string key = train::profile_key("mlp", "64x1|1");
  write_text(path, "troupe-profile 1\n" + key + "\n2\n1e-4 2e-4 10 20\n3e-4 4e-4 30 40\n");
  std::string why;
  auto back = train::read_profile(path, key, 2, &why);
  REQUIRE(back);
  CHECK((*back)[1].bwd_s == 4e-4);
  CHECK((*back)[1].act_bytes == 40);
  train::write_profile(path, train::profile_key("cnn", "64x1|1"), some_costs());
  back = train::read_profile(path, key, 2, &why);
  REQUIRE(back);
  CHECK((*back)[0].param_bytes == 10);
}
