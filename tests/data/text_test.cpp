// data/text.hpp: the corpus (vocabulary, files, errors), its seeded split
// into contiguous regions, and the windows drawn from a part.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "data/text.hpp"
#include "tests/test_util.hpp"

using namespace troupe;
using Catch::Contains;

namespace {
void write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

/// `n` bytes of lowercase letters, deterministic.
std::string letters(int64_t n) {
  std::string s;
  for (int64_t i = 0; i < n; ++i) s.push_back(static_cast<char>('a' + (i * 7 + i / 26) % 26));
  return s;
}

/// The corpus positions of a part's tokens, in order.
std::vector<int64_t> positions(const data::text_part& p) {
  std::vector<int64_t> out;
  for (const auto& r : p.regions)
    for (int64_t i = r.begin; i < r.end; ++i) out.push_back(i);
  return out;
}
} // namespace

TEST_CASE("a corpus's vocabulary is its distinct bytes, in order", "[text]") {
  const auto c = data::text_corpus::from_text("hello world\n", "greeting");
  CHECK(c.vocabulary() == "\n dehlorw");
  CHECK(c.vocab_size() == 9);
  CHECK(c.size() == 12);
  CHECK(c.tokens()[0] == 4);  // 'h'
  CHECK(c.decode(c.tokens()) == "hello world\n");
  CHECK(c.encode("row") == std::vector<int32_t>{7, 6, 8});
  CHECK_THROWS_WITH(c.encode("hex"), Contains("byte 120 at offset 2 is not in the vocabulary of greeting"));
  CHECK_THROWS_WITH(c.decode({3, 9}), Contains("token 9 is outside the vocabulary [0, 9)"));

  // A checkpoint's vocabulary: the same ids for the same bytes, a byte outside it an error.
  const auto same = data::text_corpus::from_text("low", "other", c.vocabulary());
  CHECK(same.vocabulary() == c.vocabulary());
  CHECK(same.tokens() == c.encode("low"));
  CHECK_THROWS_WITH(data::text_corpus::from_text("lox", "other", c.vocabulary()),
                    Contains("text other: byte 120 at offset 2 is not in the vocabulary"));
  CHECK_THROWS_WITH(data::text_corpus::from_text("", "nothing"), Contains("text nothing is empty"));
}

TEST_CASE("a corpus reads a file or a directory's text files in sorted order", "[text]") {
  testing::temp_dir dir;
  write(dir.file("b"), "bbb\n");
  write(dir.file("a"), "aa\n");
  write(dir.file("a.dat"), std::string("\0\1\2", 3));
  write(dir.file(".hidden"), "zzz");
  std::filesystem::create_symlink(dir.file("a"), dir.file("a.u8"));
  std::filesystem::create_directory(dir.file("sub"));
  write(dir.file("sub/c"), "ccc");

  const auto c = data::text_corpus::read(dir.path());
  CHECK(c.source() == dir.path());
  CHECK(c.files() == std::vector<std::string>{dir.file("a"), dir.file("b")});
  CHECK(c.decode(c.tokens()) == "aa\nbbb\n");
  CHECK(c.vocabulary() == "\nab");

  const auto one = data::text_corpus::read(dir.file("b"));
  CHECK(one.files() == std::vector<std::string>{dir.file("b")});
  CHECK(one.vocabulary() == "\nb");
  const auto given = data::text_corpus::read(dir.file("b"), c.vocabulary());
  CHECK(given.tokens() == c.encode("bbb\n"));
}

TEST_CASE("reading a corpus names the file and what is wrong", "[text]") {
  testing::temp_dir dir;
  CHECK_THROWS_WITH(data::text_corpus::read(dir.file("missing")),
                    Contains("text corpus " + dir.file("missing") + " does not exist"));
  CHECK_THROWS_WITH(data::text_corpus::read(dir.path()),
                    Contains("text directory " + dir.path() + " holds no text file"));
  write(dir.file("x.dat"), "index");
  CHECK_THROWS_WITH(data::text_corpus::read(dir.path()), Contains("holds no text file"));
  write(dir.file("empty"), "");
  CHECK_THROWS_WITH(data::text_corpus::read(dir.path()), Contains("text file " + dir.file("empty") + " is empty"));
  CHECK_THROWS_WITH(data::text_corpus::read(dir.file("empty")), Contains(dir.file("empty") + " is empty"));
  write(dir.file("t"), "abz");
  CHECK_THROWS_WITH(data::text_corpus::read(dir.file("t"), "ab"),
                    Contains("text " + dir.file("t") + ": byte 122 at offset 2 is not in the vocabulary"));
  CHECK_THROWS_WITH(data::text_corpus::from_text("a", "v", "aba"), Contains("byte 97 twice"));
}

TEST_CASE("the split gives each part contiguous regions, seeded", "[text]") {
  const auto c = data::text_corpus::from_text(letters(1000));
  data::text_split_options o;
  o.regions = 10;
  o.validation = 0.1;
  o.test = 0.2;
  o.seed = 4;
  const auto p = c.split(o);
  CHECK(p.train.name == "train");
  CHECK(p.validation.name == "validation");
  CHECK(p.test.name == "test");
  CHECK(p.train.tokens() == 700);
  CHECK(p.validation.tokens() == 100);
  CHECK(p.test.tokens() == 200);
  // Disjoint, covering, each part's regions sorted and separated (neighbours merged).
  std::vector<int64_t> all;
  for (const auto* part : {&p.train, &p.validation, &p.test}) {
    const auto pos = positions(*part);
    all.insert(all.end(), pos.begin(), pos.end());
    for (std::size_t i = 1; i < part->regions.size(); ++i)
      CHECK(part->regions[i - 1].end < part->regions[i].begin);
  }
  std::sort(all.begin(), all.end());
  for (std::size_t i = 0; i < all.size(); ++i) REQUIRE(all[i] == static_cast<int64_t>(i));
  CHECK(all.size() == 1000);

  CHECK(positions(c.split(o).test) == positions(p.test));  // the same seed, the same parts
  std::set<std::vector<int64_t>> tests;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    o.seed = seed;
    tests.insert(positions(c.split(o).test));
  }
  CHECK(tests.size() > 1);  // other seeds, other regions

  o.validation = 0.01;  // at least one region
  CHECK(c.split(o).validation.tokens() == 100);
  o.validation = 0;
  o.test = 0;
  CHECK(c.split(o).validation.regions.empty());
  CHECK(c.split(o).train.regions.size() == 1);
}

TEST_CASE("split options that do not fit are errors", "[text]") {
  const auto c = data::text_corpus::from_text(letters(50), "small");
  data::text_split_options o;
  o.regions = 4;
  o.validation = 1.0;
  CHECK_THROWS_WITH(c.split(o), Contains("split of text small: validation and test fractions must be in [0, 1)"));
  o.validation = 0.5;
  o.test = 0.5;
  CHECK_THROWS_WITH(c.split(o), Contains("2 validation and 2 test regions of 4 leave train none"));
  o.regions = 51;
  CHECK_THROWS_WITH(c.split(o), Contains("51 regions of 50 tokens"));
  o.regions = 0;
  CHECK_THROWS_AS(c.split(o), error);
}

TEST_CASE("windows are context + 1 tokens inside one region, the same for a seed", "[text]") {
  const auto c = data::text_corpus::from_text(letters(600));
  data::text_split_options o;
  o.regions = 6;
  o.seed = 2;
  const auto parts = c.split(o);
  const int64_t context = 16;
  data::window_sampler a(c, parts.train, context, 9), b(c, parts.train, context, 9), other(c, parts.train, context, 10);
  CHECK(a.context() == context);
  int64_t windows = 0;
  for (const auto& r : parts.train.regions) windows += std::max<int64_t>(0, r.size() - context);
  CHECK(a.windows() == windows);

  data::text_batch x, y, z;
  a.sample(8, x);
  b.sample(8, y);
  other.sample(8, z);
  REQUIRE(x.inputs.shape() == shape{8, context});
  REQUIRE(x.targets.size() == 8u * context);
  CHECK(x.size() == 8);
  CHECK(x.inputs.to_vector() == y.inputs.to_vector());
  CHECK(x.targets == y.targets);
  CHECK(x.inputs.to_vector() != z.inputs.to_vector());
  const auto& tokens = c.tokens();
  for (int64_t n = 0; n < 8; ++n) {
    // The window's start: the one place in a train region where its tokens are.
    bool found = false;
    for (const auto& r : parts.train.regions)
      for (int64_t s = r.begin; s + context + 1 <= r.end && !found; ++s) {
        bool same = true;
        for (int64_t t = 0; t < context && same; ++t)
          same = tokens[s + t] == static_cast<int32_t>(x.inputs.at(n * context + t)) &&
                 tokens[s + t + 1] == x.targets[n * context + t];
        found = same;
      }
    CHECK(found);
  }
  a.sample(8, x);
  CHECK(x.inputs.to_vector() != y.inputs.to_vector());  // the generator moves on
}

TEST_CASE("a region of exactly one window, and parts shorter than one", "[text]") {
  const auto c = data::text_corpus::from_text("abcdefghi", "nine");
  data::text_split_options whole;
  whole.regions = 1;
  whole.validation = whole.test = 0;
  data::window_sampler s(c, c.split(whole).train, 8, 1);
  CHECK(s.windows() == 1);
  data::text_batch b;
  s.sample(3, b);
  CHECK(c.decode(std::vector<int32_t>(b.targets.begin(), b.targets.begin() + 8)) == "bcdefghi");
  CHECK_THROWS_WITH(data::window_sampler(c, c.split(whole).train, 9, 1),
                    Contains("text nine: the train part (9 tokens in 1 regions, the longest 9) is shorter than one "
                             "window of context + 1 = 10 tokens"));
  CHECK_THROWS_WITH(data::window_sampler(c, c.split(whole).train, 0, 1), Contains("context must be >= 1"));
  CHECK_THROWS_WITH(s.sample(0, b), Contains("n must be >= 1"));
  CHECK_THROWS_WITH(data::window_sampler(c, c.split(whole).validation, 2, 1), Contains("the validation part (0 tokens"));
}

TEST_CASE("the default corpus: Debian's fortunes, when installed", "[text]") {
  if (!std::filesystem::exists(data::default_text_dir())) {
    WARN("skipped: " << data::default_text_dir() << " is missing (apt-get install fortunes)");
    return;
  }
  const auto c = data::text_corpus::read(data::default_text_dir());
  REQUIRE_FALSE(c.files().empty());
  for (const auto& f : c.files()) {
    CHECK_FALSE(f.find(".dat") == f.size() - 4);
    CHECK_FALSE(f.find(".u8") == f.size() - 3);
  }
  CHECK(std::is_sorted(c.files().begin(), c.files().end()));
  CHECK(c.size() > 100000);
  CHECK(c.vocab_size() > 60);
  CHECK(std::is_sorted(c.vocabulary().begin(), c.vocabulary().end(),
                       [](char x, char y) { return static_cast<unsigned char>(x) < static_cast<unsigned char>(y); }));
  const auto parts = c.split({});
  CHECK(parts.train.tokens() + parts.validation.tokens() + parts.test.tokens() == c.size());
  data::window_sampler s(c, parts.validation, 128, 1);
  data::text_batch b;
  s.sample(4, b);
  CHECK(b.inputs.shape() == shape{4, 128});
}
