#include "train/generate.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "data/text.hpp"
#include "model/zoo.hpp"
#include "net/checkpoint.hpp"
#include "tensor/error.hpp"

namespace troupe {

namespace {

/// A token drawn from `logits` (V values) as `o` says, with `rng`.
int32_t sample(const float* logits, int64_t v, const generate_options& o, std::mt19937_64& rng) {
  std::vector<int32_t> order(static_cast<std::size_t>(v));
  std::iota(order.begin(), order.end(), 0);
  // Ties go to the lower id: the same order on every library.
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (o.temperature == 0.0f) return order[0];
  const std::size_t k = o.top_k > 0 ? std::min<std::size_t>(static_cast<std::size_t>(o.top_k), order.size()) : order.size();
  std::vector<double> p(k);
  double sum = 0;
  for (std::size_t i = 0; i < k; ++i) {
    p[i] = std::exp((static_cast<double>(logits[order[i]]) - logits[order[0]]) / o.temperature);
    sum += p[i];
  }
  // Our own uniform draw from the generator's bits: the same on every library.
  double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * sum;
  for (std::size_t i = 0; i < k; ++i) {
    if (u < p[i]) return order[i];
    u -= p[i];
  }
  return order[k - 1];
}

/// The context of a gpt checkpoint: its positional embedding's length.
int64_t context_of(const net::checkpoint& c, const std::string& path) {
  const std::string key = "positional_embedding(";
  const std::size_t at = c.architecture.find(key);
  if (at == std::string::npos) throw error("checkpoint " + path + " holds no gpt (no positional embedding)");
  return std::stoll(c.architecture.substr(at + key.size()));
}

} // namespace

std::string generate(model::model& net, const std::string& vocabulary, const generate_options& o) {
  if (o.tokens < 0) throw error("generate: tokens must be >= 0, got " + std::to_string(o.tokens));
  if (!(o.temperature >= 0.0f) || !std::isfinite(o.temperature))
    throw error("generate: temperature must be >= 0, got " + std::to_string(o.temperature));
  if (o.top_k < 0) throw error("generate: top-k must be >= 0 (0: all tokens), got " + std::to_string(o.top_k));
  const data::text_corpus vocab = data::text_corpus::from_text(vocabulary, "the checkpoint's vocabulary", vocabulary);
  std::vector<int32_t> ids = o.prompt.empty() ? std::vector<int32_t>{} : vocab.encode(o.prompt);
  if (ids.empty()) ids.push_back(vocabulary.find('\n') != std::string::npos ? vocab.encode("\n")[0] : 0);
  const int64_t context = net.input_shape()[0], v = vocab.vocab_size();
  const kernels::context ctx = kernels::context::with_threads(std::max(1, o.threads));
  std::mt19937_64 rng(o.seed);
  tensor x = tensor::zeros({1, context});
  std::vector<int32_t> out;
  for (int64_t n = 0; n < o.tokens; ++n) {
    // The last `context` tokens from position 0; the positions after them do
    // not reach these logits (the model is causal) and stay 0.
    const int64_t len = std::min<int64_t>(context, static_cast<int64_t>(ids.size()));
    std::fill(x.data(), x.data() + context, 0.0f);
    for (int64_t t = 0; t < len; ++t) x.data()[t] = static_cast<float>(ids[ids.size() - len + t]);
    const tensor& logits = net.forward(ctx, x, false);
    const int32_t next = sample(logits.data() + (len - 1) * v, v, o, rng);
    ids.push_back(next);
    out.push_back(next);
  }
  return vocab.decode(out);
}

std::string generate(const std::string& checkpoint_path, const generate_options& o) {
  const net::checkpoint c = net::load_checkpoint(checkpoint_path);
  if (c.vocabulary.empty())
    throw error("checkpoint " + checkpoint_path + " holds no vocabulary: it is not a language model's "
                "(troupe_trainer --model gpt writes one)");
  const int64_t context = context_of(c, checkpoint_path);
  model::model net = zoo::gpt(static_cast<int64_t>(c.vocabulary.size()), context);
  net.build({context}, 1);
  net.load_state(c.architecture, c.params);
  return generate(net, c.vocabulary, o);
}

} // namespace troupe
