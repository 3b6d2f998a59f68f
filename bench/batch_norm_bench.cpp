// Batch norm's backward pass with a ReLU after it, on ResNet-20's activations (batch 64 of 28 x 28
// Fashion-MNIST images: [64, 16, 28, 28], [64, 32, 14, 14], [64, 64, 7, 7]): the ReLU's mask read
// from its output y (`relu_output`, what the layer passed before) against the mask computed from x and
// the forward's scale and shift (`relu_affine`, what the layer passes now: one stream fewer in both
// passes). The two take turns within each round (bench/interleaved.hpp); medians over the rounds.
// Warm (the default): each timed call follows one untimed call of the same candidate, which leaves
// its arrays in the caches as far as they fit. --cold 1: 64 MiB are written before each timed call
// instead, so that the arrays come from memory. The outputs of both are compared bit for bit first
// ("same_bits"). One JSON line per shape: each candidate's us and output_mask / affine_mask.
//   troupe_batch_norm_bench [--threads T] [--reps R] [--cold 0|1]
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/interleaved.hpp"
#include "kernels/kernels.hpp"

namespace {

namespace k = troupe::kernels;
using troupe::shape;
using troupe::tensor;

tensor filled(const shape& s, uint64_t seed) {
  tensor t = tensor::empty(s);
  uint64_t v = seed;
  for (int64_t i = 0; i < t.numel(); ++i) {
    v = v * 6364136223846793005ULL + 1442695040888963407ULL;
    t.data()[i] = static_cast<float>(static_cast<int64_t>(v >> 40) % 2001 - 1000) / 500.0f;
  }
  return t;
}

bool same_bits(const tensor& a, const tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.numel() * sizeof(float)) == 0;
}

} // namespace

int main(int argc, char** argv) {
  int64_t threads = 2, reps = 31, cold = 0;
  troupe::bench::parse_int_flags(argc, argv, {{"--threads", &threads}, {"--reps", &reps}, {"--cold", &cold}},
                                 "troupe_batch_norm_bench [--threads T] [--reps R] [--cold 0|1]");
  const k::context ctx = k::context::with_threads(static_cast<int>(threads));
  std::vector<char> junk(std::size_t{64} << 20);
  for (const shape& s : {shape{64, 16, 28, 28}, shape{64, 32, 14, 14}, shape{64, 64, 7, 7}}) {
    const int64_t c = s[1];
    const tensor x = filled(s, 1), dy = filled(s, 2), gamma = filled({c}, 3), beta = filled({c}, 4);
    tensor rm = tensor::zeros({c}), rv = tensor::full({c}, 1.0f), y, mean, invstd, affine;
    k::batch_norm_forward_train(ctx, x, gamma, beta, 1e-5f, 0.1f, rm, rv, y, mean, invstd, true, nullptr, &affine);
    tensor dx[2], dg[2], db[2];
    auto by_output = [&] { k::batch_norm_backward(ctx, x, gamma, mean, invstd, dy, dx[0], dg[0], db[0], &y); };
    auto by_affine = [&] {
      k::batch_norm_backward(ctx, x, gamma, mean, invstd, dy, dx[1], dg[1], db[1], nullptr, &affine);
    };
    by_output();
    by_affine();
    const bool same = same_bits(dx[0], dx[1]) && same_bits(dg[0], dg[1]) && same_bits(db[0], db[1]);
    const std::vector<std::function<void()>> fs{by_output, by_affine};
    const std::vector<double> t = troupe::bench::median_interleaved(fs, static_cast<int>(reps), [&](std::size_t i) {
      if (cold)
        for (std::size_t j = 0; j < junk.size(); j += 64) ++junk[j];
      else
        fs[i]();
    });
    std::printf("{\"bench\":\"batch_norm_backward_relu\",\"shape\":\"%s\",\"threads\":%d,\"cold\":%d,"
                "\"output_mask_us\":%.1f,\"affine_mask_us\":%.1f,\"output_over_affine\":%.3f,\"same_bits\":%s}\n",
                s.to_string().c_str(), static_cast<int>(threads), static_cast<int>(cold), t[0] * 1e6, t[1] * 1e6,
                t[0] / t[1], same ? "true" : "false");
  }
  return 0;
}
