#pragma once

// Text for language models: a corpus of characters-as-bytes tokens, its split
// into train, validation and test parts, and random windows of it.
//
//   auto corpus = data::text_corpus::read(data::default_text_dir());
//   auto parts = corpus.split({});                       // seeded, contiguous regions
//   data::window_sampler train(corpus, parts.train, /*context=*/128, /*seed=*/1);
//   data::text_batch b;
//   train.sample(32, b);   // b.inputs [32, 128] ids as floats, b.targets the next tokens

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tensor/tensor.hpp"

namespace troupe::data {

/// Where Debian's fortunes package puts its English text (the default corpus).
std::string default_text_dir();

/// Tokens [begin, end) of a corpus.
struct text_region {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

/// One part of a corpus (train, validation or test): contiguous regions of its
/// token stream, in corpus order, neighbours merged.
struct text_part {
  std::string name;
  std::vector<text_region> regions;
  int64_t tokens() const;
};

struct text_parts {
  text_part train, validation, test;
};

/// How text_corpus::split cuts a corpus: into `regions` contiguous regions of
/// (nearly) equal size, of which round(regions * validation) go to validation
/// (at least one when validation > 0), round(regions * test) to test (likewise)
/// and the rest to train, chosen by a permutation drawn from `seed`.
struct text_split_options {
  double validation = 0.1;
  double test = 0.1;
  int64_t regions = 20;
  uint64_t seed = 1;
};

/// A corpus of text whose tokens are its bytes. Its vocabulary is the distinct
/// bytes it holds, in ascending order, as a string (what a checkpoint stores):
/// token i is the byte vocabulary()[i].
class text_corpus {
public:
  /// Reads a file, or the files of a directory: every regular file in it (not
  /// in subdirectories) except hidden ones and fortune's `.dat` indexes and
  /// `.u8` links, in sorted order of their names, one after the other. Throws
  /// troupe::error naming the path and what is wrong: missing, an empty file,
  /// a directory without text files.
  static text_corpus read(const std::string& path);
  /// The same with a given vocabulary (a checkpoint's): a byte that is not in
  /// it is an error naming the file and where the byte is.
  static text_corpus read(const std::string& path, const std::string& vocabulary);
  /// A corpus of `text` (named `name` in errors), its vocabulary built from it
  /// or, when given, `vocabulary`.
  static text_corpus from_text(const std::string& text, const std::string& name = "text",
                               const std::string& vocabulary = "");

  /// The file or directory read (or from_text's name).
  const std::string& source() const { return source_; }
  /// The files read, in order.
  const std::vector<std::string>& files() const { return files_; }
  const std::string& vocabulary() const { return vocabulary_; }
  int64_t vocab_size() const { return static_cast<int64_t>(vocabulary_.size()); }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }

  /// The tokens of `text`; throws troupe::error for a byte outside the vocabulary.
  std::vector<int32_t> encode(const std::string& text) const;
  /// The text of `ids`; throws troupe::error for an id outside [0, vocab_size()).
  std::string decode(const std::vector<int32_t>& ids) const;

  /// Train, validation and test parts (see text_split_options). Throws
  /// troupe::error for fractions outside [0, 1), fractions that leave train no
  /// region, or more regions than tokens.
  text_parts split(const text_split_options& options) const;

private:
  /// Tokens of `bytes` (from `name`) appended; a byte outside the vocabulary throws.
  void append(const std::string& bytes, const std::string& name);
  void set_vocabulary(const std::string& vocabulary);

  std::string source_;
  std::vector<std::string> files_;
  std::string vocabulary_;
  int32_t index_[256] = {};  // byte -> token, -1 outside the vocabulary
  std::vector<int32_t> tokens_;
};

/// Windows of a part: inputs [n, context] (token ids as floats: the model's
/// input) and targets, n * context next tokens (row-major [n, context]).
struct text_batch {
  tensor inputs;
  std::vector<int32_t> targets;
  int64_t size() const { return inputs.defined() ? inputs.dim(0) : 0; }
};

/// The seed of epoch `epoch`'s windows in a run of seed `seed`: each epoch
/// draws other windows, the same in every run of that seed.
inline uint64_t epoch_seed(uint64_t seed, int epoch) {
  return seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch) + 1;
}

/// Draws windows of context + 1 tokens from a part, uniformly over every start
/// whose window lies inside one of its regions, from a generator seeded with
/// `seed`: the same seed gives the same windows.
class window_sampler {
public:
  /// Keeps references to `corpus` (which must outlive it) and copies `part`.
  /// Throws troupe::error naming the corpus and the part when no region of the
  /// part holds one window (context + 1 tokens), or context < 1.
  window_sampler(const text_corpus& corpus, const text_part& part, int64_t context, uint64_t seed);

  /// Fills `out` with `n` windows (its buffers reused when their size fits).
  void sample(int64_t n, text_batch& out);
  /// The number of distinct windows (starts) in the part.
  int64_t windows() const { return starts_.back(); }
  int64_t context() const { return context_; }

private:
  /// The corpus position of window `w` in [0, windows()).
  int64_t start_of(int64_t w) const;

  const text_corpus* corpus_;
  text_part part_;
  int64_t context_;
  std::vector<int64_t> starts_;  // starts_[i]: windows in regions before i; back(): all
  std::mt19937_64 rng_;
};

} // namespace troupe::data
