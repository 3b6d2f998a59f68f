// conv2d throughput: the reference CNN's two convolution layers (and
// ResNet-20's), forward and backward, on each path (automatic, direct,
// Winograd, im2col), against OpenBLAS's sgemm 1024^3 in the same run. Candidates take
// turns within each round; medians over the rounds. Prints one JSON line per
// layer and one for the GEMM.
//   troupe_conv_bench [--threads T] [--reps R] [--batch N] [--layers cnn|resnet|all] [--only NAME]
// With --pool 1: each layer as the CNN runs it, conv -> ReLU -> 2x2 max pool, by the three kernels one
// after the other and by conv2d_relu_pool_forward/backward in one pass (the automatic path), taking turns.
// Instruction counts (valgrind 3.19 has no AVX-512: an AVX2 build, see docs/benchmarks.md):
//   valgrind --tool=callgrind troupe_conv_bench --threads 1 --reps 1 --batch 16 --only conv2

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <random>

#include "bench/interleaved.hpp"
#include "kernels/kernels.hpp"

namespace {

namespace k = troupe::kernels;
using troupe::shape;
using troupe::tensor;

tensor random_tensor(const shape& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  tensor t = tensor::empty(s);
  for (int64_t i = 0; i < t.numel(); ++i) t.at(i) = d(rng);
  return t;
}

using troupe::bench::median_interleaved;

struct layer {
  std::string name;
  int64_t c, oc, kernel, stride, padding, h, w;
  bool dx;  ///< the layer's input gradient is computed (not the first layer)
};

struct setup {
  layer l;
  k::conv2d_geometry g;
  tensor x, w, b, dy;
  tensor y, cols, dx, dw, db;
};

struct options {
  int threads = 2, reps = 15;
  int64_t batch = 64;
  std::string layers = "cnn";
  std::string only;  ///< the layers whose name contains it (empty: all)
  bool pool = false;  ///< conv -> ReLU -> 2x2 max pool, unfused against fused
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--threads") o.threads = std::atoi(argv[i + 1]);
    else if (a == "--reps") o.reps = std::atoi(argv[i + 1]);
    else if (a == "--batch") o.batch = std::atoll(argv[i + 1]);
    else if (a == "--layers") o.layers = argv[i + 1];
    else if (a == "--only") o.only = argv[i + 1];
    else if (a == "--pool") o.pool = std::atoi(argv[i + 1]) != 0;
    else {
      std::fprintf(stderr, "usage: troupe_conv_bench [--threads T] [--reps R] [--batch N] [--layers cnn|resnet|all] "
                           "[--only NAME] [--pool 0|1]\n");
      std::exit(2);
    }
  }
  return o;
}

std::vector<layer> layers_of(const std::string& which) {
  std::vector<layer> layers;
  if (which == "cnn" || which == "all") {
    layers.push_back({"cnn.conv1 1->32 3x3 28x28", 1, 32, 3, 1, 1, 28, 28, false});
    layers.push_back({"cnn.conv2 32->64 3x3 14x14", 32, 64, 3, 1, 1, 14, 14, true});
  }
  if (which == "resnet" || which == "all") {
    layers.push_back({"resnet.stem 1->16 3x3 28x28", 1, 16, 3, 1, 1, 28, 28, false});
    layers.push_back({"resnet.stage1 16->16 3x3 28x28", 16, 16, 3, 1, 1, 28, 28, true});
    layers.push_back({"resnet.down2 16->32 3x3 s2 28x28", 16, 32, 3, 2, 1, 28, 28, true});
    layers.push_back({"resnet.proj2 16->32 1x1 s2 28x28", 16, 32, 1, 2, 0, 28, 28, true});
    layers.push_back({"resnet.stage2 32->32 3x3 14x14", 32, 32, 3, 1, 1, 14, 14, true});
    layers.push_back({"resnet.stage3 64->64 3x3 7x7", 64, 64, 3, 1, 1, 7, 7, true});
  }
  return layers;
}

struct path {
  const char* name;
  k::conv_path conv;
};
// automatic is what training uses: Winograd where it pays, direct elsewhere.
const path paths[] = {{"automatic", k::conv_path::automatic},
                      {"direct", k::conv_path::direct},
                      {"winograd", k::conv_path::winograd},
                      {"im2col", k::conv_path::im2col}};
constexpr std::size_t path_count = sizeof(paths) / sizeof(paths[0]);

/// The layers `o` asks for, each with its random input, weights and output gradient.
std::vector<setup> setups_of(const options& o) {
  std::vector<setup> ss;
  for (const layer& l : layers_of(o.layers)) {
    if (l.name.find(o.only) == std::string::npos) continue;
    setup s;
    s.l = l;
    s.g = k::conv2d_geometry{l.c, l.oc, l.kernel, l.stride, l.padding};
    s.x = random_tensor({o.batch, l.c, l.h, l.w}, 3);
    s.w = random_tensor({l.oc, l.c, l.kernel, l.kernel}, 4);
    s.b = random_tensor({l.oc}, 5);
    s.dy = random_tensor(k::conv2d_output_shape(s.x.shape(), s.g), 6);
    ss.push_back(std::move(s));
  }
  return ss;
}

/// --pool: per layer, conv -> ReLU -> 2x2 max pool forward, and forward + backward, by the three kernels
/// and in one pass; one JSON line per layer.
void run_pool(const options& o) {
  std::vector<setup> ss = setups_of(o);
  const k::context ctx = k::context::with_threads(o.threads);
  struct pooled {
    tensor conv_y, y, window, spread;
    std::vector<int32_t> argmax;
  };
  std::vector<pooled> ps(ss.size());
  std::vector<std::function<void()>> fs;
  for (std::size_t i = 0; i < ss.size(); ++i) {
    setup& s = ss[i];
    pooled& p = ps[i];
    s.dy = random_tensor(k::pool2d_output_shape(k::conv2d_output_shape(s.x.shape(), s.g), {}), 6);
    const auto unfused_fwd = [&s, &p, ctx] {
      k::conv2d_forward(ctx, s.x, s.w, s.b, s.g, p.conv_y, s.cols, true);
      k::max_pool2d_forward(ctx, p.conv_y, {}, p.y, p.argmax);
    };
    const auto fused_fwd = [&s, &p, ctx] { k::conv2d_relu_pool_forward(ctx, s.x, s.w, s.b, s.g, p.y, p.window); };
    fs.push_back(unfused_fwd);
    fs.push_back([&s, &p, ctx, unfused_fwd] {
      unfused_fwd();
      k::max_pool2d_backward(ctx, s.dy, p.argmax, p.conv_y.shape(), p.spread);
      k::conv2d_backward(ctx, s.x, s.w, s.cols, p.spread, s.g, s.l.dx ? &s.dx : nullptr, s.dw, &s.db, &p.conv_y);
    });
    fs.push_back(fused_fwd);
    fs.push_back([&s, &p, ctx, fused_fwd] {
      fused_fwd();
      k::conv2d_relu_pool_backward(ctx, s.x, s.w, s.dy, p.y, p.window, s.g, s.l.dx ? &s.dx : nullptr, s.dw, &s.db);
    });
  }
  const std::vector<double> t = median_interleaved(fs, o.reps);
  for (std::size_t i = 0; i < ss.size(); ++i) {
    const double* m = t.data() + 4 * i;  // unfused fwd, unfused fwd+bwd, fused fwd, fused fwd+bwd
    std::printf("{\"bench\":\"conv2d_relu_pool\",\"layer\":\"%s\",\"batch\":%lld,\"threads\":%d,"
                "\"unfused_fwd_ms\":%.3f,\"unfused_bwd_ms\":%.3f,\"fused_fwd_ms\":%.3f,\"fused_bwd_ms\":%.3f,"
                "\"fwd_speedup\":%.3f,\"bwd_speedup\":%.3f,\"total_speedup\":%.3f}\n",
                ss[i].l.name.c_str(), static_cast<long long>(o.batch), o.threads, m[0] * 1e3, (m[1] - m[0]) * 1e3,
                m[2] * 1e3, (m[3] - m[2]) * 1e3, m[0] / m[2], (m[1] - m[0]) / (m[3] - m[2]), m[1] / m[3]);
  }
}

} // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  openblas_set_num_threads(o.threads);
  if (o.pool) {
    run_pool(o);
    return 0;
  }
  // OpenBLAS sgemm 1024^3, the yardstick.
  const int n = 1024;
  tensor a = random_tensor({n, n}, 1), bm = random_tensor({n, n}, 2), cm = tensor::zeros({n, n});
  std::vector<std::function<void()>> fs{[&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, bm.data(), n, 0.0f,
                cm.data(), n);
  }};
  std::vector<setup> ss = setups_of(o);
  // Per layer and path: forward, and forward + backward; the GEMM first.
  for (setup& s : ss)
    for (const path& p : paths) {
      k::context ctx = k::context::with_threads(o.threads);
      ctx.conv = p.conv;
      fs.push_back([&s, ctx] { k::conv2d_forward(ctx, s.x, s.w, s.b, s.g, s.y, s.cols); });
      fs.push_back([&s, ctx] {
        k::conv2d_forward(ctx, s.x, s.w, s.b, s.g, s.y, s.cols);
        k::conv2d_backward(ctx, s.x, s.w, s.cols, s.dy, s.g, s.l.dx ? &s.dx : nullptr, s.dw, &s.db);
      });
    }
  const std::vector<double> t = median_interleaved(fs, o.reps);
  const double gemm_gflops = 2.0 * n * n * n / t[0] / 1e9;
  std::printf("{\"bench\":\"sgemm\",\"size\":%d,\"threads\":%d,\"gflops\":%.1f}\n", n, o.threads, gemm_gflops);
  // GFLOP/s count a direct convolution's multiply-adds: for Winograd, the rate it is worth, not the one it runs.
  double total_flop = 0, total_ms[path_count] = {};
  for (std::size_t i = 0; i < ss.size(); ++i) {
    const setup& s = ss[i];
    const shape ys = s.dy.shape();
    const double fwd_flop = 2.0 * o.batch * s.l.oc * ys[2] * ys[3] * s.l.c * s.l.kernel * s.l.kernel;
    const double bwd_flop = fwd_flop * (s.l.dx ? 2 : 1);
    total_flop += fwd_flop + bwd_flop;
    std::printf("{\"bench\":\"conv2d\",\"layer\":\"%s\",\"batch\":%lld,\"threads\":%d", s.l.name.c_str(),
                static_cast<long long>(o.batch), o.threads);
    for (std::size_t j = 0; j < path_count; ++j) {
      // Backward alone = (forward + backward) - forward, as the forward pass's saved state is part of it.
      const std::size_t at = 1 + 2 * (i * path_count + j);
      const double f = t[at], b = t[at + 1] - f;
      total_ms[j] += (f + b) * 1e3;
      std::printf(",\"%s_fwd_ms\":%.3f,\"%s_bwd_ms\":%.3f,\"%s_fwd_gflops\":%.1f,\"%s_bwd_gflops\":%.1f",
                  paths[j].name, f * 1e3, paths[j].name, b * 1e3, paths[j].name, fwd_flop / f / 1e9, paths[j].name,
                  bwd_flop / b / 1e9);
    }
    std::printf("}\n");
  }
  std::printf("{\"bench\":\"conv2d_total\",\"layers\":\"%s\"", o.layers.c_str());
  for (std::size_t j = 0; j < path_count; ++j)
    std::printf(",\"%s_ms\":%.3f,\"%s_gflops\":%.1f,\"%s_vs_sgemm\":%.3f", paths[j].name, total_ms[j],
                paths[j].name, total_flop / total_ms[j] / 1e6, paths[j].name,
                total_flop / total_ms[j] / 1e6 / gemm_gflops);
  std::printf("}\n");
}
