// The layers' costs kept across processes (--profile-cache): read back as
// written, nothing for another key or a missing file, and a file that is not
// a profile is measured again with a reason, never trusted.
#include <catch2/catch.hpp>

#include <fstream>

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
