#include "train/generate.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "data/text.hpp"
#include "model/init.hpp"
#include "model/zoo.hpp"
#include "net/checkpoint.hpp"
#include "train/cluster.hpp"
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
  // Nucleus sampling: the fewest likeliest tokens that hold top_p of the probability.
  std::size_t n = k;
  if (o.top_p < 1.0f) {
    double held = 0;
    for (n = 0; n < k && (n == 0 || held < o.top_p * sum); ++n) held += p[n];
    sum = held;
  }
  // Our own uniform draw from the generator's bits: the same on every library.
  double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * sum;
  for (std::size_t i = 0; i < n; ++i) {
    if (u < p[i]) return order[i];
    u -= p[i];
  }
  return order[n - 1];
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
  model::no_initial_draws values_from_the_checkpoint;
  net.build({context}, 1);
  return net;
}

/// The logits of the next token after `ids`, each call one token longer: those the model gives
/// for the tokens of its window, from position 0. The window is the text's last tokens while they
/// fit in the context; when the text outgrows it, the window moves on by `shift` tokens (1: the
/// last `context` tokens, always).
class next_logits {
public:
  next_logits(model::model& net, const kernels::context& ctx, const generate_options& o)
      : net_(net), ctx_(ctx), context_(net.input_shape()[0]), shift_(o.window_shift), cache_(o.cache && net.decodes()) {
    if (shift_ < 1 || shift_ > context_)
      throw error("generate: window-shift must be in [1, " + std::to_string(context_) + "] (the context), got " +
                  std::to_string(shift_));
    if (cache_) a_ = net.make_activations();
    else x_ = tensor::zeros({1, context_});
  }

  /// Row of the last token's logits (V values), valid until the next call.
  const float* operator()(const std::vector<int32_t>& ids) {
    const int64_t size = static_cast<int64_t>(ids.size()), v = net_.output_shape()[1];
    if (size - from_ > context_) {  // every token's position changes: the window is decoded again
      from_ = std::max(size - context_, from_ + shift_);
      held_ = 0;
    }
    const int64_t len = size - from_;
    if (!cache_) {  // the whole window; positions after it do not reach its logits (causal) and stay 0
      std::fill(x_.data(), x_.data() + context_, 0.0f);
      for (int64_t t = 0; t < len; ++t) x_.data()[t] = static_cast<float>(ids[from_ + t]);
      return net_.forward(ctx_, x_, false).data() + (len - 1) * v;
    }
    tensor x = tensor::empty({1, len - held_});  // the tokens after those the model's state holds
    for (int64_t t = 0; t < x.dim(1); ++t) x.data()[t] = static_cast<float>(ids[from_ + held_ + t]);
    const tensor& logits = net_.decode(ctx_, x, held_, a_);
    held_ = len;
    return logits.data() + (x.dim(1) - 1) * v;
  }

private:
  model::model& net_;
  const kernels::context& ctx_;
  const int64_t context_, shift_;
  const bool cache_;
  model::activations a_;
  tensor x_;
  int64_t from_ = 0, held_ = 0;  // the window's first token in ids; the positions decoded into a_
};

} // namespace

std::string generate(model::model& net, const std::string& vocabulary, const generate_options& o) {
  if (o.tokens < 0) throw error("generate: tokens must be >= 0, got " + std::to_string(o.tokens));
  if (!(o.temperature >= 0.0f) || !std::isfinite(o.temperature))
    throw error("generate: temperature must be >= 0, got " + std::to_string(o.temperature));
  if (o.top_k < 0) throw error("generate: top-k must be >= 0 (0: all tokens), got " + std::to_string(o.top_k));
  if (!(o.top_p > 0.0f && o.top_p <= 1.0f))
    throw error("generate: top-p must be in (0, 1] (1: all tokens), got " + std::to_string(o.top_p));
  const data::text_corpus vocab = data::text_corpus::from_text(vocabulary, "the checkpoint's vocabulary", vocabulary);
  std::vector<int32_t> ids = o.prompt.empty() ? std::vector<int32_t>{} : vocab.encode(o.prompt);
  if (ids.empty()) ids.push_back(vocabulary.find('\n') != std::string::npos ? vocab.encode("\n")[0] : 0);
  if (o.threads < 0) throw error("generate: threads must be >= 0 (0: every CPU it may use), got " + std::to_string(o.threads));
  const kernels::context ctx = kernels::context::with_threads(o.threads == 0 ? train::usable_cores() : o.threads);
  std::mt19937_64 rng(o.seed);
  next_logits logits(net, ctx, o);
  std::vector<int32_t> out;
  for (int64_t n = 0; n < o.tokens; ++n) {
    const float* row = logits(ids);
    if (!std::all_of(row, row + vocab.vocab_size(), [](float l) { return std::isfinite(l); }))
      throw error("generate: the model's logits for token " + std::to_string(n + 1) +
                  " are not finite (NaN or infinite): its weights have diverged or are corrupt");
    const int32_t next = sample(row, vocab.vocab_size(), o, rng);
    ids.push_back(next);
    out.push_back(next);
    if (o.on_token) o.on_token(vocab.decode({next}));
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
