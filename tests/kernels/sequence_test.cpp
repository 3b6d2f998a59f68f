// The transformer kernels (kernels/sequence.hpp) against naive double-precision
// references, by numerical gradients, and on their error cases.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/kernels.hpp"
#include "kernels/sequence.hpp"
#include "tests/gradcheck.hpp"
#include "tests/test_util.hpp"

using namespace troupe;
namespace k = troupe::kernels;
using Catch::Contains;

namespace {
const k::context ctx = testing::test_context();
const k::context one = k::context::with_threads(1);

std::vector<int32_t> random_ids(int64_t n, int32_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> ids(static_cast<std::size_t>(n));
  for (auto& id : ids) id = d(rng);
  return ids;
}

bool same_bits(const tensor& a, const tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.numel() * sizeof(float)) == 0;
}

/// Largest |a - want| / (1 + |want|).
double worst_error(const tensor& a, const std::vector<double>& want) {
  REQUIRE(static_cast<std::size_t>(a.numel()) == want.size());
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) worst = std::max(worst, std::abs(a.at(i) - want[i]) / (1 + std::abs(want[i])));
  return worst;
}

// ------------------------------------------------------------ naive references, in double

struct ln_ref {
  std::vector<double> y, mean, rstd;
};

ln_ref naive_layer_norm(const tensor& x, const tensor& gamma, const tensor& beta, double eps) {
  const int64_t c = gamma.numel(), rows = x.numel() / c;
  ln_ref r{std::vector<double>(x.numel()), std::vector<double>(rows), std::vector<double>(rows)};
  for (int64_t i = 0; i < rows; ++i) {
    double m = 0, v = 0;
    for (int64_t j = 0; j < c; ++j) m += x.at(i * c + j);
    m /= c;
    for (int64_t j = 0; j < c; ++j) v += (x.at(i * c + j) - m) * (x.at(i * c + j) - m);
    const double s = 1 / std::sqrt(v / c + eps);
    r.mean[i] = m;
    r.rstd[i] = s;
    for (int64_t j = 0; j < c; ++j)
      r.y[i * c + j] = (x.at(i * c + j) - m) * s * gamma.at(j) + (beta.defined() ? beta.at(j) : 0.0);
  }
  return r;
}

double naive_gelu(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

struct attn_ref {
  std::vector<double> out, probs;
};

attn_ref naive_attention(const tensor& qkv, int64_t heads) {
  const int64_t b_n = qkv.dim(0), t_n = qkv.dim(1), c = qkv.dim(2) / 3, d = c / heads;
  attn_ref r{std::vector<double>(b_n * t_n * c, 0.0), std::vector<double>(b_n * heads * t_n * t_n, 0.0)};
  auto at = [&](int64_t b, int64_t t, int64_t part, int64_t h, int64_t j) {
    return double(qkv.at((b * t_n + t) * 3 * c + part * c + h * d + j));
  };
  for (int64_t b = 0; b < b_n; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < t_n; ++i) {
        std::vector<double> s(i + 1);
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          for (int64_t e = 0; e < d; ++e) s[j] += at(b, i, 0, h, e) * at(b, j, 1, h, e);
          s[j] /= std::sqrt(double(d));
          mx = std::max(mx, s[j]);
        }
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(s[j] - mx);
        for (int64_t j = 0; j <= i; ++j) {
          const double p = std::exp(s[j] - mx) / sum;
          r.probs[((b * heads + h) * t_n + i) * t_n + j] = p;
          for (int64_t e = 0; e < d; ++e) r.out[(b * t_n + i) * c + h * d + e] += p * at(b, j, 2, h, e);
        }
      }
  return r;
}

struct attn_case {
  int64_t batch, time, channels, heads;
};
} // namespace

// ------------------------------------------------------------ layer norm

TEST_CASE("layer_norm_forward matches a double reference", "[sequence]") {
  struct dims { int64_t b, t, c; };
  for (dims d : {dims{2, 3, 5}, dims{1, 1, 7}, dims{2, 4, 19}, dims{3, 2, 64}, dims{4, 64, 160}}) {
    for (bool with_beta : {true, false}) {
      INFO("[" << d.b << ", " << d.t << ", " << d.c << "], beta " << with_beta);
      tensor x = testing::random_tensor({d.b, d.t, d.c}, 1, -2.0f, 3.0f);
      tensor gamma = testing::random_tensor({d.c}, 2), beta = with_beta ? testing::random_tensor({d.c}, 3) : tensor();
      tensor y, mean, rstd;
      k::layer_norm_forward(ctx, x, gamma, beta, 1e-5f, y, mean, rstd);
      CHECK(y.shape() == x.shape());
      CHECK(mean.shape() == shape{d.b * d.t});
      const ln_ref want = naive_layer_norm(x, gamma, beta, 1e-5);
      CHECK(worst_error(y, want.y) < 1e-5);
      CHECK(worst_error(mean, want.mean) < 1e-6);
      CHECK(worst_error(rstd, want.rstd) < 1e-5);
    }
  }
}

TEST_CASE("layer_norm_backward passes numerical gradient checks for x, gamma and beta", "[sequence]") {
  for (int64_t c : {5, 11}) {
    const int64_t t_n = c == 5 ? 1 : 3;
    INFO("C = " << c << ", T = " << t_n);
    tensor x = testing::random_tensor({2, t_n, c}, 4), gamma = testing::random_tensor({c}, 5, 0.5f, 1.5f);
    tensor beta = testing::random_tensor({c}, 6), r = testing::random_tensor({2, t_n, c}, 7);
    tensor y, mean, rstd, dx, dgamma = tensor::full({c}, 7.0f), dbeta = tensor::full({c}, 7.0f);
    auto loss = [&] {
      k::layer_norm_forward(ctx, x, gamma, beta, 1e-5f, y, mean, rstd);
      return testing::dot(y, r);
    };
    loss();
    k::layer_norm_backward(ctx, x, gamma, mean, rstd, r, dx, dgamma, dbeta);
    testing::check_gradient(x, dx, loss, 1e-3, 2e-2);
    testing::check_gradient(gamma, dgamma, loss, 1e-2, 1e-2);  // overwritten: the 7s are gone
    testing::check_gradient(beta, dbeta, loss, 1e-2, 1e-2);
  }
}

TEST_CASE("layer_norm_backward gives the same bits on 1 and 2 threads", "[sequence]") {
  // Large enough that both loops split over threads; C not a multiple of 16.
  const int64_t c = 157;
  tensor x = testing::random_tensor({4, 64, c}, 8), gamma = testing::random_tensor({c}, 9), dy = testing::random_tensor({4, 64, c}, 10);
  tensor y, mean, rstd, dx1, dg1, db1, dx2, dg2, db2;
  k::layer_norm_forward(ctx, x, gamma, tensor(), 1e-5f, y, mean, rstd);
  k::layer_norm_backward(one, x, gamma, mean, rstd, dy, dx1, dg1, db1);
  k::layer_norm_backward(ctx, x, gamma, mean, rstd, dy, dx2, dg2, db2);
  CHECK(same_bits(dx1, dx2));
  CHECK(same_bits(dg1, dg2));
  CHECK(same_bits(db1, db2));
}

// ------------------------------------------------------------ GELU

TEST_CASE("gelu matches the tanh approximation and its derivative", "[sequence]") {
  tensor x = testing::random_tensor({3, 5, 13}, 11, -4.0f, 4.0f), y, dx;
  k::gelu_forward(ctx, x, y);
  std::vector<double> want(x.numel());
  for (int64_t i = 0; i < x.numel(); ++i) want[i] = naive_gelu(x.at(i));
  CHECK(worst_error(y, want) < 1e-6);
  CHECK(y.at(0) == Approx(naive_gelu(x.at(0))).margin(1e-6));
  // Known values: gelu(0) = 0, gelu(1) ~ 0.8412, gelu(-3) ~ -0.0036.
  tensor z = tensor::from({3}, {0.0f, 1.0f, -3.0f}), zy;
  k::gelu_forward(ctx, z, zy);
  CHECK(zy.at(0) == 0.0f);
  CHECK(zy.at(1) == Approx(0.841192).margin(1e-5));
  CHECK(zy.at(2) == Approx(-0.003637).margin(1e-5));
  tensor r = testing::random_tensor(x.shape(), 12);
  k::gelu_backward(ctx, x, r, dx);
  auto loss = [&] {
    double s = 0;
    for (int64_t i = 0; i < x.numel(); ++i) s += naive_gelu(x.at(i)) * r.at(i);
    return s;
  };
  testing::check_gradient(x, dx, loss, 1e-3, 1e-3);
  CHECK_THROWS_AS(k::gelu_backward(ctx, x, tensor::zeros({3, 5, 12}), dx), shape_error);
}

TEST_CASE("gelu holds far from 0, where its tanh saturates", "[sequence]") {
  // Large inputs reach the clamp of the kernel's exponential: gelu(x) -> x for x >> 0, -> 0 for x << 0;
  // its derivative -> 1 and 0. Small ones test tanh's sign and the cancellation in 1 - e^(-2u).
  const std::vector<float> xs{-1e4f, -60.0f, -9.0f, -1e-3f, -1e-6f, 1e-6f, 1e-3f, 9.0f, 60.0f, 1e4f};
  tensor x = tensor::from({static_cast<int64_t>(xs.size())}, xs), y, dx;
  k::gelu_forward(ctx, x, y);
  k::gelu_backward(ctx, x, tensor::full(x.shape(), 1.0f), dx);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const double v = xs[i], h = 1e-4 * std::max(1.0, std::abs(v));
    CHECK(y.at(static_cast<int64_t>(i)) == Approx(naive_gelu(v)).epsilon(1e-6).margin(1e-7));
    CHECK(dx.at(static_cast<int64_t>(i)) ==
          Approx((naive_gelu(v + h) - naive_gelu(v - h)) / (2 * h)).epsilon(1e-4).margin(1e-6));
  }
}

// ------------------------------------------------------------ attention

TEST_CASE("attention_forward matches a double reference for one and several heads", "[sequence]") {
  for (attn_case a : {attn_case{2, 5, 8, 1}, attn_case{2, 5, 8, 2}, attn_case{1, 1, 6, 3}, attn_case{2, 7, 12, 4},
                      attn_case{1, 9, 10, 2}, attn_case{2, 32, 64, 4}}) {
    INFO("B " << a.batch << ", T " << a.time << ", C " << a.channels << ", heads " << a.heads);
    tensor qkv = testing::random_tensor({a.batch, a.time, 3 * a.channels}, 13, -2.0f, 2.0f), out, probs;
    k::attention_forward(ctx, qkv, a.heads, out, probs);
    REQUIRE(out.shape() == shape{a.batch, a.time, a.channels});
    REQUIRE(probs.shape() == shape{a.batch, a.heads, a.time, a.time});
    const attn_ref want = naive_attention(qkv, a.heads);
    CHECK(worst_error(out, want.out) < 1e-5);
    CHECK(worst_error(probs, want.probs) < 1e-5);
    int64_t above_diagonal = 0;  // exact zeros where j > i
    for (int64_t r = 0; r < probs.numel() / a.time; ++r)
      for (int64_t j = r % a.time + 1; j < a.time; ++j) above_diagonal += probs.at(r * a.time + j) != 0.0f;
    CHECK(above_diagonal == 0);
    tensor out1, probs1;  // one thread: the GEMMs on the context's threads rather than inside a parallel loop
    k::attention_forward(one, qkv, a.heads, out1, probs1);
    CHECK(worst_error(out1, std::vector<double>(out.data(), out.data() + out.numel())) < 1e-6);
  }
}

TEST_CASE("attention_decode gives attention_forward's rows for queries after the cached positions", "[sequence]") {
  // Rows [start, start + n) of one sequence's forward pass, from a cache that holds positions [0, start + n)
  // and a few rows more (a cache grows ahead of the positions decoded).
  for (attn_case a : {attn_case{1, 9, 8, 1}, attn_case{1, 9, 12, 3}, attn_case{1, 40, 64, 4}}) {
    const tensor qkv = testing::random_tensor({1, a.time, 3 * a.channels}, 18, -2.0f, 2.0f);
    tensor cache = tensor::zeros({a.time + 3, 3 * a.channels}), out, probs, got, scratch;
    std::copy(qkv.data(), qkv.data() + qkv.numel(), cache.data());
    for (const k::context* c : {&ctx, &one}) {
      k::attention_forward(*c, qkv, a.heads, out, probs);
      for (int64_t start : {int64_t{0}, int64_t{1}, a.time / 2, a.time - 1})
        for (int64_t n : {int64_t{1}, a.time - start}) {
          INFO("T " << a.time << ", C " << a.channels << ", heads " << a.heads << ", start " << start << ", n " << n);
          k::attention_decode(*c, cache, start, n, a.heads, got, scratch);
          REQUIRE(got.shape() == shape{1, n, a.channels});
          const float* want = out.data() + start * a.channels;
          CHECK(worst_error(got, std::vector<double>(want, want + n * a.channels)) < 1e-5);
        }
    }
  }
  tensor cache = testing::random_tensor({4, 3 * 8}, 19), got, scratch;
  CHECK_THROWS_WITH(k::attention_decode(ctx, cache, 3, 2, 2, got, scratch), Contains("P >= start + n"));
  CHECK_THROWS_WITH(k::attention_decode(ctx, cache, 0, 1, 3, got, scratch), Contains("3 heads do not divide"));
  CHECK_THROWS_AS(k::attention_decode(ctx, cache, 0, 0, 2, got, scratch), shape_error);
}

TEST_CASE("attention_backward passes a numerical gradient check for q, k and v", "[sequence]") {
  for (attn_case a : {attn_case{2, 4, 6, 1}, attn_case{1, 5, 8, 2}, attn_case{2, 3, 12, 4}, attn_case{1, 1, 4, 2}}) {
    INFO("B " << a.batch << ", T " << a.time << ", C " << a.channels << ", heads " << a.heads);
    tensor qkv = testing::random_tensor({a.batch, a.time, 3 * a.channels}, 14);
    tensor r = testing::random_tensor({a.batch, a.time, a.channels}, 15), out, probs, dqkv;
    auto loss = [&] {
      k::attention_forward(ctx, qkv, a.heads, out, probs);
      return testing::dot(out, r);
    };
    loss();
    k::attention_backward(ctx, qkv, probs, r, dqkv);
    testing::check_gradient(qkv, dqkv, loss, 1e-2, 1e-2);
  }
}

TEST_CASE("attention_backward on 1 and 2 threads agrees, on a size that splits", "[sequence]") {
  tensor qkv = testing::random_tensor({2, 32, 3 * 64}, 16), dout = testing::random_tensor({2, 32, 64}, 17);
  tensor out, probs, d1, d2;
  k::attention_forward(ctx, qkv, 4, out, probs);
  k::attention_backward(one, qkv, probs, dout, d1);
  k::attention_backward(ctx, qkv, probs, dout, d2);
  CHECK(worst_error(d2, std::vector<double>(d1.data(), d1.data() + d1.numel())) < 1e-6);
}

TEST_CASE("attention on the Eigen backend matches OpenBLAS", "[sequence]") {
  k::context eigen = ctx;
  eigen.gemm = k::gemm_backend::eigen;
  for (int threads : {1, 2}) {
    eigen.threads = threads;
    tensor qkv = testing::random_tensor({2, 32, 3 * 64}, 40), dout = testing::random_tensor({2, 32, 64}, 41);
    tensor out, probs, dqkv, out_e, probs_e, dqkv_e;
    k::attention_forward(ctx, qkv, 4, out, probs);
    k::attention_backward(ctx, qkv, probs, dout, dqkv);
    k::attention_forward(eigen, qkv, 4, out_e, probs_e);
    k::attention_backward(eigen, qkv, probs_e, dout, dqkv_e);
    INFO(threads << " threads");
    CHECK(worst_error(out_e, std::vector<double>(out.data(), out.data() + out.numel())) < 1e-5);
    CHECK(worst_error(dqkv_e, std::vector<double>(dqkv.data(), dqkv.data() + dqkv.numel())) < 1e-5);
  }
}

TEST_CASE("attention is causal: a later token changes no earlier output or gradient", "[sequence]") {
  const int64_t t_n = 6, c = 8, heads = 2, later = 3;
  tensor qkv = testing::random_tensor({2, t_n, 3 * c}, 18), out, probs;
  k::attention_forward(ctx, qkv, heads, out, probs);
  tensor changed = qkv.clone(), out2, probs2;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t j = 0; j < 3 * c; ++j) changed.at((b * t_n + later) * 3 * c + j) += 5.0f;  // its q, k and v
  k::attention_forward(ctx, changed, heads, out2, probs2);
  int64_t earlier_changed = 0, later_changed = 0;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < t_n; ++t)
      for (int64_t j = 0; j < c; ++j) {
        const bool differs = out.at((b * t_n + t) * c + j) != out2.at((b * t_n + t) * c + j);
        (t < later ? earlier_changed : later_changed) += differs;
      }
  CHECK(earlier_changed == 0);
  CHECK(later_changed > 0);
  // A loss on the outputs before `later` sends no gradient to the q, k, v from `later` on.
  std::vector<float> g = testing::random_tensor({2, t_n, c}, 19).to_vector();
  for (int64_t b = 0; b < 2; ++b) std::fill(g.begin() + (b * t_n + later) * c, g.begin() + (b + 1) * t_n * c, 0.0f);
  tensor dout = tensor::from({2, t_n, c}, g), dqkv;
  k::attention_backward(ctx, qkv, probs, dout, dqkv);
  int64_t nonzero = 0;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = later * 3 * c; i < t_n * 3 * c; ++i) nonzero += dqkv.at(b * t_n * 3 * c + i) != 0.0f;
  CHECK(nonzero == 0);
}

TEST_CASE("attention rejects bad shapes and head counts", "[sequence]") {
  tensor out, probs, dqkv;
  CHECK_THROWS_WITH(k::attention_forward(ctx, tensor::zeros({2, 3, 10}), 1, out, probs), Contains("[B, T, 3C]"));
  CHECK_THROWS_WITH(k::attention_forward(ctx, tensor::zeros({2, 3, 12}), 3, out, probs),
                    Contains("3 heads do not divide the 4 channels"));
  CHECK_THROWS_AS(k::attention_forward(ctx, tensor::zeros({2, 3, 12}), 0, out, probs), shape_error);
  CHECK_THROWS_AS(k::attention_forward(ctx, tensor::zeros({6, 12}), 1, out, probs), shape_error);
  tensor qkv = tensor::zeros({2, 3, 12});
  k::attention_forward(ctx, qkv, 2, out, probs);
  CHECK_THROWS_WITH(k::attention_backward(ctx, qkv, probs, tensor::zeros({2, 3, 5}), dqkv), Contains("dout"));
  CHECK_THROWS_WITH(k::attention_backward(ctx, qkv, tensor::zeros({2, 2, 3, 4}), out, dqkv), Contains("probs"));
}

// ------------------------------------------------------------ embeddings

TEST_CASE("embedding_forward copies the table rows of the tokens", "[sequence]") {
  const int32_t vocab = 11;
  const int64_t c = 13;
  const std::vector<int32_t> ids = random_ids(2 * 5, vocab, 20);
  const k::token_ids tok = k::token_ids::of(ids, 2);
  CHECK(tok.time == 5);
  tensor table = testing::random_tensor({vocab, c}, 21), y;
  k::embedding_forward(ctx, tok, table, y);
  REQUIRE(y.shape() == shape{2, 5, c});
  int64_t wrong = 0;
  for (int64_t n = 0; n < 10; ++n)
    for (int64_t j = 0; j < c; ++j) wrong += y.at(n * c + j) != table.at(ids[n] * c + j);
  CHECK(wrong == 0);
}

TEST_CASE("embedding_backward sums dy per token and passes a numerical gradient check", "[sequence]") {
  const int32_t vocab = 6;
  const int64_t c = 7;
  const std::vector<int32_t> ids = random_ids(3 * 4, vocab - 1, 22);  // token 5 never occurs
  const k::token_ids tok = k::token_ids::of(ids, 3);
  tensor table = testing::random_tensor({vocab, c}, 23), r = testing::random_tensor({3, 4, c}, 24), y;
  tensor dtable = tensor::full({vocab, c}, 9.0f);  // overwritten
  k::embedding_backward(ctx, tok, r, dtable);
  std::vector<double> want(vocab * c, 0.0);
  for (int64_t n = 0; n < 12; ++n)
    for (int64_t j = 0; j < c; ++j) want[ids[n] * c + j] += r.at(n * c + j);
  CHECK(worst_error(dtable, want) < 1e-6);
  for (int64_t j = 0; j < c; ++j) CHECK(dtable.at(5 * c + j) == 0.0f);
  auto loss = [&] {
    k::embedding_forward(ctx, tok, table, y);
    return testing::dot(y, r);
  };
  testing::check_gradient(table, dtable, loss, 1e-2, 1e-3);
}

TEST_CASE("embedding_backward gives the same bits on 1, 2 and 3 threads", "[sequence]") {
  // Few distinct tokens (many sums per row), a size that splits, C not a multiple of 16.
  const int32_t vocab = 7;
  const int64_t c = 203;
  const std::vector<int32_t> ids = random_ids(4 * 64, vocab, 25);
  const k::token_ids tok = k::token_ids::of(ids, 4);
  tensor dy = testing::random_tensor({4, 64, c}, 26, -1e3f, 1e3f);
  tensor d1 = tensor::zeros({vocab, c}), d2 = tensor::zeros({vocab, c}), d3 = tensor::zeros({vocab, c});
  k::embedding_backward(one, tok, dy, d1);
  k::embedding_backward(k::context::with_threads(2), tok, dy, d2);
  k::embedding_backward(k::context::with_threads(3), tok, dy, d3);
  CHECK(same_bits(d1, d2));
  CHECK(same_bits(d1, d3));
}

TEST_CASE("embeddings reject a token outside the vocabulary, naming it", "[sequence]") {
  tensor table = tensor::zeros({5, 3}), y, dtable = tensor::zeros({5, 3});
  const std::vector<int32_t> high = {0, 1, 2, 9, 4, 0}, low = {0, -1};
  CHECK_THROWS_MATCHES(k::embedding_forward(ctx, k::token_ids::of(high, 2), table, y), troupe::error,
                       testing::message(Contains("token 9 at batch 1, time 0") && Contains("[0, 5)")));
  CHECK_THROWS_WITH(k::embedding_forward(ctx, k::token_ids::of(low, 1), table, y), Contains("token -1 at batch 0, time 1"));
  CHECK_THROWS_WITH(k::embedding_backward(ctx, k::token_ids::of(high, 2), tensor::zeros({2, 3, 3}), dtable),
                    Contains("token 9"));
  CHECK_THROWS_WITH(k::embedding_backward(ctx, k::token_ids::of(low, 1), tensor::zeros({1, 2, 4}), dtable),
                    Contains("token -1"));
  const std::vector<int32_t> fine = {0, 1}, none;
  CHECK_THROWS_AS(k::embedding_backward(ctx, k::token_ids::of(fine, 1), tensor::zeros({1, 2, 4}), dtable), shape_error);
  CHECK_THROWS_AS(k::token_ids::of(high, 4), troupe::error);
  CHECK_THROWS_AS(k::token_ids::of(none, 1), troupe::error);
  CHECK_THROWS_AS(k::token_ids::of(fine, 0), troupe::error);
}

TEST_CASE("position embeddings add rows 0 to T-1 and sum their gradient over the batch", "[sequence]") {
  const int64_t t_max = 6, t_n = 4, c = 9;
  tensor table = testing::random_tensor({t_max, c}, 27), base = testing::random_tensor({3, t_n, c}, 28);
  tensor y = base.clone();
  k::position_embedding_forward(ctx, table, y);
  int64_t wrong = 0;
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t t = 0; t < t_n; ++t)
      for (int64_t j = 0; j < c; ++j) {
        const int64_t i = (b * t_n + t) * c + j;
        wrong += y.at(i) != base.at(i) + table.at(t * c + j);
      }
  CHECK(wrong == 0);
  tensor r = testing::random_tensor({3, t_n, c}, 29), dtable = tensor::full({t_max, c}, 4.0f);
  k::position_embedding_backward(ctx, r, dtable);
  std::vector<double> want(t_max * c, 0.0);
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t i = 0; i < t_n * c; ++i) want[i] += r.at(b * t_n * c + i);
  CHECK(worst_error(dtable, want) < 1e-6);  // rows T..T_max-1 are 0
  auto loss = [&] {
    y.copy_from(base);
    k::position_embedding_forward(ctx, table, y);
    return testing::dot(y, r);
  };
  testing::check_gradient(table, dtable, loss, 1e-2, 1e-3);
  tensor too_long = tensor::zeros({1, t_max + 1, c});
  CHECK_THROWS_WITH(k::position_embedding_forward(ctx, table, too_long), Contains("T_max >= T"));
  CHECK_THROWS_AS(k::position_embedding_backward(ctx, too_long, dtable), shape_error);
}

TEST_CASE("position embeddings from a later first position add rows first to first + T - 1", "[sequence]") {
  const int64_t t_max = 7, c = 5;
  tensor table = testing::random_tensor({t_max, c}, 30), base = testing::random_tensor({1, 3, c}, 31);
  tensor y = base.clone();
  k::position_embedding_forward(ctx, table, y, 4);  // rows 4, 5, 6: the last three
  int64_t wrong = 0;
  for (int64_t i = 0; i < y.numel(); ++i) wrong += y.at(i) != base.at(i) + table.at(4 * c + i);
  CHECK(wrong == 0);
  CHECK_THROWS_WITH(k::position_embedding_forward(ctx, table, y, 5), Contains("T_max >= 5 + T"));
  CHECK_THROWS_AS(k::position_embedding_forward(ctx, table, y, -1), shape_error);
}

// ------------------------------------------------------------ cross-entropy

TEST_CASE("sequence_cross_entropy matches a double reference and its gradient", "[sequence]") {
  struct dims { int64_t b, t, v; };
  for (dims d : {dims{2, 3, 13}, dims{1, 1, 5}, dims{3, 4, 64}, dims{4, 64, 150}}) {
    INFO("[" << d.b << ", " << d.t << ", " << d.v << "]");
    tensor logits = testing::random_tensor({d.b, d.t, d.v}, 30, -4.0f, 4.0f), dlogits;
    const std::vector<int32_t> targets = random_ids(d.b * d.t, static_cast<int32_t>(d.v), 31);
    const k::token_ids tok = k::token_ids::of(targets, d.b);
    const float loss = k::sequence_cross_entropy(ctx, logits, tok, &dlogits);
    const int64_t n = d.b * d.t;
    double want = 0;
    std::vector<double> want_d(logits.numel());
    for (int64_t r = 0; r < n; ++r) {
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j < d.v; ++j) mx = std::max(mx, double(logits.at(r * d.v + j)));
      for (int64_t j = 0; j < d.v; ++j) sum += std::exp(logits.at(r * d.v + j) - mx);
      want += mx + std::log(sum) - logits.at(r * d.v + targets[r]);
      for (int64_t j = 0; j < d.v; ++j)
        want_d[r * d.v + j] = (std::exp(logits.at(r * d.v + j) - mx) / sum - (j == targets[r])) / n;
    }
    CHECK(loss == Approx(want / n).epsilon(1e-6));
    CHECK(worst_error(dlogits, want_d) < 1e-6);
    CHECK(k::sequence_cross_entropy(ctx, logits, tok, nullptr) == loss);
    CHECK(k::sequence_cross_entropy(one, logits, tok, nullptr) == loss);
  }
}

TEST_CASE("sequence_cross_entropy passes a numerical gradient check", "[sequence]") {
  tensor logits = testing::random_tensor({2, 3, 7}, 32, -2.0f, 2.0f), dlogits;
  const std::vector<int32_t> targets = {0, 6, 3, 3, 1, 5};
  const k::token_ids tok = k::token_ids::of(targets, 2);
  k::sequence_cross_entropy(ctx, logits, tok, &dlogits);
  testing::check_gradient(logits, dlogits, [&] { return double(k::sequence_cross_entropy(ctx, logits, tok, nullptr)); },
                          1e-2, 1e-2);
}

TEST_CASE("sequence_cross_entropy rejects a target out of range and mismatched shapes", "[sequence]") {
  tensor logits = tensor::zeros({2, 3, 5}), dlogits;
  const std::vector<int32_t> high = {0, 1, 2, 3, 5, 0}, low = {-2, 0, 0, 0, 0, 0};
  CHECK_THROWS_MATCHES(k::sequence_cross_entropy(ctx, logits, k::token_ids::of(high, 2), &dlogits), troupe::error,
                       testing::message(Contains("target 5 at batch 1, time 1") && Contains("[0, 5)")));
  CHECK_THROWS_WITH(k::sequence_cross_entropy(ctx, logits, k::token_ids::of(low, 2), nullptr), Contains("target -2"));
  CHECK_THROWS_AS(k::sequence_cross_entropy(ctx, logits, k::token_ids::of(high, 3), nullptr), shape_error);
  CHECK_THROWS_AS(k::sequence_cross_entropy(ctx, tensor::zeros({6, 5}), k::token_ids::of(high, 2), nullptr), shape_error);
  tensor inf = tensor::full({1, 1, 2}, INFINITY);
  const std::vector<int32_t> zero = {0};
  CHECK_THROWS_AS(k::sequence_cross_entropy(ctx, inf, k::token_ids::of(zero, 1), nullptr), diverged_error);
}

// ------------------------------------------------------------ AdamW

TEST_CASE("adamw_step decays the weights apart from the gradient", "[sequence]") {
  SECTION("two steps by hand") {
    tensor w = tensor::from({1}, {2.0f}), g = tensor::from({1}, {0.5f}), m = tensor::zeros({1}), v = tensor::zeros({1});
    k::adamw_step(ctx, w, g, m, v, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 1);
    // Step 1: m_hat = g, v_hat = g^2: w -= lr * (sign(g) + wd * w).
    CHECK(w.at(0) == Approx(2.0 - 0.1 * (1.0 + 0.01 * 2.0)).epsilon(1e-6));
    const double w1 = 2.0 - 0.1 * (1.0 + 0.02);
    g.at(0) = -0.5f;
    k::adamw_step(ctx, w, g, m, v, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 2);
    const double m2 = 0.9 * 0.05 + 0.1 * -0.5, v2 = 0.999 * 0.00025 + 0.001 * 0.25;
    const double mh = m2 / (1 - 0.81), vh = v2 / (1 - 0.999 * 0.999);
    CHECK(m.at(0) == Approx(m2).margin(1e-7));  // the moments see g alone, not the decay
    CHECK(w.at(0) == Approx(w1 - 0.1 * (mh / (std::sqrt(vh) + 1e-8) + 0.01 * w1)).epsilon(1e-5));
  }
  SECTION("without weight decay it is adam_step") {
    tensor w = testing::random_tensor({37}, 33), g = testing::random_tensor({37}, 34);
    tensor w2 = w.clone(), m = tensor::zeros({37}), v = tensor::zeros({37}), m2 = m.clone(), v2 = v.clone();
    for (int64_t step = 1; step <= 3; ++step) {
      k::adamw_step(ctx, w, g, m, v, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f, step);
      k::adam_step(ctx, w2, g, m2, v2, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f, step);
    }
    CHECK(worst_error(w, std::vector<double>(w2.data(), w2.data() + 37)) < 1e-6);
  }
  SECTION("split over threads it computes every element as on one") {
    const int64_t n = (int64_t{1} << 16) + 5;
    tensor w = testing::random_tensor({n}, 35), g = testing::random_tensor({n}, 36), m = tensor::zeros({n});
    tensor v = tensor::zeros({n}), w1 = w.clone(), m1 = m.clone(), v1 = v.clone();
    k::adamw_step(ctx, w, g, m, v, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 1);
    k::adamw_step(one, w1, g, m1, v1, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 1);
    CHECK(same_bits(w, w1));
  }
  tensor w = tensor::zeros({2}), m = tensor::zeros({2}), v = tensor::zeros({2});
  CHECK_THROWS_AS(k::adamw_step(ctx, w, tensor::zeros({3}), m, v, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, 1), shape_error);
  CHECK_THROWS_WITH(k::adamw_step(ctx, w, w, m, v, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, 0), Contains("step counts from 1"));
}

TEST_CASE("layer_norm rejects mismatched shapes", "[sequence]") {
  tensor x = tensor::zeros({2, 3, 4}), y, mean, rstd, dx, dg, db;
  CHECK_THROWS_WITH(k::layer_norm_forward(ctx, x, tensor::zeros({5}), tensor(), 1e-5f, y, mean, rstd),
                    Contains("layer_norm_forward") && Contains("gamma"));
  CHECK_THROWS_WITH(k::layer_norm_forward(ctx, x, tensor::zeros({4}), tensor::zeros({3}), 1e-5f, y, mean, rstd),
                    Contains("beta"));
  k::layer_norm_forward(ctx, x, tensor::full({4}, 1.0f), tensor(), 1e-5f, y, mean, rstd);
  CHECK_THROWS_WITH(k::layer_norm_backward(ctx, x, tensor::full({4}, 1.0f), mean, rstd, tensor::zeros({2, 3, 5}), dx, dg, db),
                    Contains("dy"));
  CHECK_THROWS_WITH(k::layer_norm_backward(ctx, x, tensor::full({4}, 1.0f), tensor::zeros({5}), rstd, x, dx, dg, db),
                    Contains("mean"));
}
