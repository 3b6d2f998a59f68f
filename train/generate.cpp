#include "train/generate.hpp"

#include <algorithm>
#include <cctype>
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

/// The number after `key` in `text` from `from`, or -1 where `key` is not there or no number follows it.
int64_t number_after(const std::string& text, const std::string& key, std::size_t from = 0) {
  const std::size_t at = text.find(key, from);
  if (at == std::string::npos) return -1;
  const std::size_t begin = at + key.size();
  std::size_t end = begin;
  while (end < text.size() && end - begin < 9 && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
  return end > begin ? std::stoll(text.substr(begin, end - begin)) : -1;
}

/// The zoo::gpt a checkpoint's architecture describes, built: its context and width from the positional
/// embedding ("positional_embedding(C x D)"), its blocks counted, their heads and MLP ratio from the first
/// ("transformer_block(D, H heads, mlp xR)"). load_state then checks every layer against the checkpoint.
model::model gpt_of(const net::checkpoint& c, const std::string& path) {
  const std::string& a = c.architecture;
  const int64_t context = number_after(a, "positional_embedding(");
  const std::size_t pos = a.find("positional_embedding(");
  const int64_t dim = number_after(a, " x ", pos);
  if (context <= 0 || dim <= 0) throw error("checkpoint " + path + " holds no gpt (no positional embedding)");
  int64_t blocks = 0;
  for (std::size_t at = a.find("transformer_block("); at != std::string::npos; at = a.find("transformer_block(", at + 1))
    ++blocks;
  const std::size_t first = a.find("transformer_block(");
  const int64_t heads = blocks > 0 ? number_after(a, ", ", first) : 1;
  const int64_t ratio = blocks > 0 ? number_after(a, "mlp x", first) : 1;
  if (heads <= 0 || ratio <= 0) throw error("checkpoint " + path + ": cannot read its transformer blocks");
  // Sizes the checkpoint's own tensors could not hold are not built (a description that lies).
  double stored = 0;  // in doubles: the products of up to 9-digit sizes do not overflow
  for (const auto& e : c.params) stored += static_cast<double>(e.value.numel());
  const int64_t vocab = static_cast<int64_t>(c.vocabulary.size());
  const double d = static_cast<double>(dim);
  if (static_cast<double>(context) * d > stored || static_cast<double>(vocab) * d > stored ||
      (blocks > 0 && d * d * static_cast<double>(ratio) > stored))
    throw error("checkpoint " + path + ": its architecture (" + a + ") is larger than its " +
                std::to_string(static_cast<int64_t>(stored)) + " stored values");
  model::model net = zoo::gpt(vocab, context, dim, heads, blocks, ratio);
  net.build({context}, 1);
  return net;
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
  model::model net = gpt_of(c, checkpoint_path);
  net.load_state(c.architecture, c.params);
  return generate(net, c.vocabulary, o);
}

} // namespace troupe
