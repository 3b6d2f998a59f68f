#include "data/text.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

namespace troupe::data {

namespace fs = std::filesystem;

namespace {

std::string n2s(int64_t v) { return std::to_string(v); }

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw error("text file " + path + " cannot be opened");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw error("text file " + path + " cannot be read");
  if (bytes.empty()) throw error("text file " + path + " is empty");
  return bytes;
}

/// The text files of `dir`, sorted: regular files, not hidden, not fortune's
/// `.dat` indexes nor its `.u8` links.
std::vector<std::string> text_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name[0] == '.' || ends_with(name, ".dat") || ends_with(name, ".u8")) continue;
    if (e.is_regular_file()) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  if (out.empty()) throw error("text directory " + dir + " holds no text file (.dat and .u8 files are skipped)");
  return out;
}

/// The sorted distinct bytes of `files`' contents.
std::string vocabulary_of(const std::vector<std::string>& contents) {
  bool seen[256] = {};
  for (const auto& c : contents)
    for (unsigned char b : c) seen[b] = true;
  std::string v;
  for (int b = 0; b < 256; ++b)
    if (seen[b]) v.push_back(static_cast<char>(b));
  return v;
}

/// Region i of `count` equal contiguous regions of n tokens.
text_region region(int64_t n, int64_t count, int64_t i) { return {i * n / count, (i + 1) * n / count}; }

/// The regions `ids` (of `count` regions of n tokens), sorted, neighbours merged.
text_part make_part(const std::string& name, std::vector<int64_t> ids, int64_t n, int64_t count) {
  std::sort(ids.begin(), ids.end());
  text_part p{name, {}};
  for (int64_t i : ids) {
    const text_region r = region(n, count, i);
    if (!p.regions.empty() && p.regions.back().end == r.begin)
      p.regions.back().end = r.end;
    else
      p.regions.push_back(r);
  }
  return p;
}

/// Regions for a fraction: round(count * f), at least one when f > 0.
int64_t regions_for(double f, int64_t count) {
  if (f <= 0) return 0;
  return std::max<int64_t>(1, std::llround(f * static_cast<double>(count)));
}

} // namespace

std::string default_text_dir() { return "/usr/share/games/fortunes"; }

int64_t text_part::tokens() const {
  int64_t n = 0;
  for (const auto& r : regions) n += r.size();
  return n;
}

text_corpus text_corpus::read(const std::string& path) { return read(path, ""); }

text_corpus text_corpus::read(const std::string& path, const std::string& vocabulary) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw error("text corpus " + path + " does not exist (give a text file or a directory of them" +
                (path == default_text_dir() ? std::string("; on Debian: apt-get install fortunes") : "") + ")");
  text_corpus c;
  c.source_ = path;
  c.files_ = fs::is_directory(path) ? text_files(path) : std::vector<std::string>{path};
  std::vector<std::string> contents;
  for (const auto& f : c.files_) contents.push_back(read_file(f));
  c.set_vocabulary(vocabulary.empty() ? vocabulary_of(contents) : vocabulary);
  for (std::size_t i = 0; i < contents.size(); ++i) c.append(contents[i], c.files_[i]);
  return c;
}

text_corpus text_corpus::from_text(const std::string& text, const std::string& name, const std::string& vocabulary) {
  if (text.empty()) throw error("text " + name + " is empty");
  text_corpus c;
  c.source_ = name;
  c.set_vocabulary(vocabulary.empty() ? vocabulary_of({text}) : vocabulary);
  c.append(text, name);
  return c;
}

void text_corpus::set_vocabulary(const std::string& vocabulary) {
  std::fill(std::begin(index_), std::end(index_), -1);
  for (std::size_t i = 0; i < vocabulary.size(); ++i) {
    const auto b = static_cast<unsigned char>(vocabulary[i]);
    if (index_[b] >= 0) throw error("text vocabulary holds byte " + n2s(b) + " twice");
    index_[b] = static_cast<int32_t>(i);
  }
  vocabulary_ = vocabulary;
}

void text_corpus::append(const std::string& bytes, const std::string& name) {
  tokens_.reserve(tokens_.size() + bytes.size());
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    const auto b = static_cast<unsigned char>(bytes[i]);
    if (index_[b] < 0)
      throw error("text " + name + ": byte " + n2s(b) + " at offset " + n2s(static_cast<int64_t>(i)) +
                  " is not in the vocabulary");
    tokens_.push_back(index_[b]);
  }
}

std::vector<int32_t> text_corpus::encode(const std::string& text) const {
  std::vector<int32_t> out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const int32_t id = index_[static_cast<unsigned char>(text[i])];
    if (id < 0)
      throw error("encode: byte " + n2s(static_cast<unsigned char>(text[i])) + " at offset " +
                  n2s(static_cast<int64_t>(i)) + " is not in the vocabulary of " + source_);
    out.push_back(id);
  }
  return out;
}

std::string text_corpus::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size())
      throw error("decode: token " + n2s(id) + " is outside the vocabulary [0, " + n2s(vocab_size()) + ")");
    out.push_back(vocabulary_[static_cast<std::size_t>(id)]);
  }
  return out;
}

text_parts text_corpus::split(const text_split_options& o) const {
  const std::string what = "split of text " + source_ + ": ";
  if (!(o.validation >= 0 && o.validation < 1) || !(o.test >= 0 && o.test < 1))
    throw error(what + "validation and test fractions must be in [0, 1)");
  if (o.regions < 1 || o.regions > size())
    throw error(what + n2s(o.regions) + " regions of " + n2s(size()) + " tokens: give 1 to " + n2s(size()));
  const int64_t n_val = regions_for(o.validation, o.regions), n_test = regions_for(o.test, o.regions);
  if (n_val + n_test >= o.regions)
    throw error(what + n2s(n_val) + " validation and " + n2s(n_test) + " test regions of " + n2s(o.regions) +
                " leave train none: lower the fractions or give more regions");
  std::vector<int64_t> order(static_cast<std::size_t>(o.regions));
  for (int64_t i = 0; i < o.regions; ++i) order[static_cast<std::size_t>(i)] = i;
  std::mt19937_64 rng(o.seed);
  for (int64_t i = o.regions - 1; i > 0; --i)  // Fisher-Yates from our own draws: the same on every library
    std::swap(order[static_cast<std::size_t>(i)], order[rng() % static_cast<uint64_t>(i + 1)]);
  const auto from = [&](int64_t a, int64_t b) {
    return std::vector<int64_t>(order.begin() + a, order.begin() + b);
  };
  return {make_part("train", from(n_val + n_test, o.regions), size(), o.regions),
          make_part("validation", from(0, n_val), size(), o.regions),
          make_part("test", from(n_val, n_val + n_test), size(), o.regions)};
}

window_sampler::window_sampler(const text_corpus& corpus, const text_part& part, int64_t context, uint64_t seed)
    : corpus_(&corpus), part_(part), context_(context), rng_(seed) {
  if (context < 1) throw error("window_sampler: context must be >= 1, got " + n2s(context));
  starts_.push_back(0);
  int64_t longest = 0;
  for (const auto& r : part_.regions) {
    starts_.push_back(starts_.back() + std::max<int64_t>(0, r.size() - context));
    longest = std::max(longest, r.size());
  }
  if (starts_.back() == 0)
    throw error("text " + corpus.source() + ": the " + part.name + " part (" + n2s(part.tokens()) + " tokens in " +
                n2s(static_cast<int64_t>(part.regions.size())) + " regions, the longest " + n2s(longest) +
                ") is shorter than one window of context + 1 = " + n2s(context + 1) +
                " tokens: use a shorter context, fewer regions or more text");
}

int64_t window_sampler::start_of(int64_t w) const {
  // The region whose windows hold w: the last i with starts_[i] <= w.
  const auto i = static_cast<std::size_t>(std::upper_bound(starts_.begin(), starts_.end(), w) - starts_.begin() - 1);
  return part_.regions[i].begin + (w - starts_[i]);
}

void window_sampler::sample(int64_t n, text_batch& out) {
  if (n < 1) throw error("window_sampler::sample: n must be >= 1, got " + n2s(n));
  if (!out.inputs.defined() || out.inputs.shape() != shape{n, context_}) out.inputs = tensor::empty({n, context_});
  out.targets.resize(static_cast<std::size_t>(n * context_));
  const int32_t* tokens = corpus_->tokens().data();
  float* in = out.inputs.data();
  for (int64_t b = 0; b < n; ++b) {
    const int64_t s = start_of(static_cast<int64_t>(rng_() % static_cast<uint64_t>(windows())));
    for (int64_t t = 0; t < context_; ++t) {
      in[b * context_ + t] = static_cast<float>(tokens[s + t]);
      out.targets[static_cast<std::size_t>(b * context_ + t)] = tokens[s + t + 1];
    }
  }
}

} // namespace troupe::data
