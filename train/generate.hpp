#pragma once

// Text from a language model: a prompt continued one sampled token at a time.
//
//   troupe::generate_options o;
//   o.prompt = "Q: ";
//   o.tokens = 200;
//   std::string text = troupe::generate("gpt.ckpt", o);  // a troupe_trainer --model gpt checkpoint

#include <cstdint>
#include <functional>
#include <string>

#include "model/model.hpp"

namespace troupe {

/// How generate() samples.
struct generate_options {
  std::string prompt;        ///< the text to continue (empty: a newline, or token 0)
  int64_t tokens = 200;      ///< tokens (bytes) to add
  float temperature = 1.0f;  ///< logits are divided by it; 0: always the most likely token
  int64_t top_k = 0;         ///< sample among the k most likely tokens only; 0: all
  /// Sample among the fewest most likely tokens whose probabilities (after
  /// temperature and top_k) add up to top_p at least (nucleus sampling); 1: all.
  float top_p = 1.0f;
  uint64_t seed = 1;         ///< the same seed, checkpoint and options give the same text
  int threads = 1;           ///< CPU threads for the forward passes; 0: every CPU the process may use
  /// Keep each attention's keys and values (model::decode), so that a token
  /// within the context costs one position's work; false: the whole window's
  /// forward pass for every token. The same text either way, up to rounding.
  /// Models that do not decode (model::decodes) always take the forward pass.
  bool cache = true;
  /// Tokens the window moves on by when the text outgrows the model's
  /// context, in [1, context]. 1: every token is drawn from the last
  /// `context` tokens, and past the context each token decodes the whole
  /// window again (as without the cache). N: the window is decoded again
  /// once every N tokens, and each token sees between context - N + 1 and
  /// context tokens before it.
  int64_t window_shift = 1;
  /// Called with each token's text as soon as it is drawn (troupe_generate
  /// prints it at once); none by default. generate() still returns the whole.
  std::function<void(const std::string&)> on_token;
};

/// The continuation of o.prompt (the prompt not included) by `net`, a built
/// language model of input [context] token ids and output [context, V]
/// logits, V = vocabulary.size(); token i is the byte vocabulary[i]. Each
/// step reads the last `context` tokens (o.window_shift says otherwise).
/// Throws troupe::error for a prompt byte outside the vocabulary, a negative
/// token count, temperature or top_k, a top_p outside (0, 1], a window_shift
/// outside [1, context].
std::string generate(model::model& net, const std::string& vocabulary, const generate_options& o);

/// The same for a checkpoint of a zoo::gpt (troupe_trainer --model gpt, or a
/// library user's of any size): the vocabulary comes from the file, and the
/// model is the zoo::gpt(vocabulary, context, dim, heads, blocks, mlp_ratio)
/// its architecture describes. Throws troupe::error when the file is missing,
/// corrupt, holds no vocabulary (not a language model's), a description its
/// tensors could not hold, or another architecture than a zoo::gpt.
std::string generate(const std::string& checkpoint_path, const generate_options& o);

} // namespace troupe
