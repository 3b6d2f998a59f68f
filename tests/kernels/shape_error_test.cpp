// Every kernel rejects mismatched shapes with a troupe::shape_error that names
// the kernel and the offending shapes.
#include <catch2/catch.hpp>

#include "kernels/kernels.hpp"
#include "tests/gradcheck.hpp"

using namespace troupe;
namespace k = troupe::kernels;
using Catch::Contains;

namespace {
const k::context ctx = troupe::testing::test_context();
} // namespace

TEST_CASE("dense rejects mismatched shapes", "[kernels][shape]") {
  tensor x = tensor::zeros({2, 5}), w = tensor::zeros({3, 4}), y, dw, dx;
  CHECK_THROWS_AS(k::dense_forward(ctx, x, w, tensor(), y), shape_error);
  CHECK_THROWS_WITH(k::dense_forward(ctx, x, w, tensor(), y), Contains("dense_forward") && Contains("[3, 4]"));
  tensor w2 = tensor::zeros({3, 5});
  CHECK_THROWS_WITH(k::dense_forward(ctx, x, w2, tensor::zeros({4}), y), Contains("bias"));
  CHECK_THROWS_WITH(k::dense_forward(ctx, tensor::zeros({5}), w2, tensor(), y), Contains("rank 2"));
  CHECK_THROWS_WITH(k::dense_backward(ctx, x, w2, tensor::zeros({2, 4}), &dx, dw, nullptr), Contains("dy"));
}

TEST_CASE("conv2d rejects mismatched shapes", "[kernels][shape]") {
  k::conv2d_geometry g{3, 4, 3, 1, 0};
  tensor y, cols, dw;
  CHECK_THROWS_WITH(k::conv2d_forward(ctx, tensor::zeros({1, 2, 5, 5}), tensor::zeros({4, 3, 3, 3}), tensor(), g, y, cols),
                    Contains("expects 3 input channels, got 2"));
  CHECK_THROWS_WITH(k::conv2d_forward(ctx, tensor::zeros({1, 3, 5, 5}), tensor::zeros({4, 3, 2, 2}), tensor(), g, y, cols),
                    Contains("w has shape [4, 3, 2, 2]"));
  CHECK_THROWS_WITH(k::conv2d_forward(ctx, tensor::zeros({1, 3, 2, 2}), tensor::zeros({4, 3, 3, 3}), tensor(), g, y, cols),
                    Contains("larger than the padded input"));
  CHECK_THROWS_WITH(k::conv2d_forward(ctx, tensor::zeros({3, 5, 5}), tensor::zeros({4, 3, 3, 3}), tensor(), g, y, cols),
                    Contains("[n, c, h, w]"));
  tensor x = tensor::zeros({1, 3, 5, 5}), w = tensor::zeros({4, 3, 3, 3});
  k::conv2d_forward(ctx, x, w, tensor(), g, y, cols);
  CHECK_THROWS_WITH(k::conv2d_backward(ctx, x, w, cols, tensor::zeros({1, 4, 2, 2}), g, nullptr, dw, nullptr),
                    Contains("dy has shape [1, 4, 2, 2], expected [1, 4, 3, 3]"));
}

TEST_CASE("pooling rejects mismatched shapes", "[kernels][shape]") {
  tensor y, dx;
  std::vector<int32_t> argmax;
  CHECK_THROWS_WITH(k::max_pool2d_forward(ctx, tensor::zeros({1, 1, 1, 3}), {2, 2}, y, argmax), Contains("larger than"));
  CHECK_THROWS_WITH(k::avg_pool2d_forward(ctx, tensor::zeros({4, 4}), {2, 2}, y), Contains("[n, c, h, w]"));
  k::max_pool2d_forward(ctx, tensor::zeros({1, 1, 4, 4}), {2, 2}, y, argmax);
  CHECK_THROWS_AS(k::max_pool2d_backward(ctx, tensor::zeros({1, 1, 3, 3}), argmax, {1, 1, 4, 4}, dx), shape_error);
  CHECK_THROWS_WITH(k::avg_pool2d_backward(ctx, tensor::zeros({1, 1, 3, 3}), {2, 2}, {1, 1, 4, 4}, dx), Contains("dy"));
}

TEST_CASE("activations, dropout and batch norm reject mismatched shapes", "[kernels][shape]") {
  tensor a = tensor::zeros({2, 3}), b = tensor::zeros({3, 2}), dx, y, mask;
  CHECK_THROWS_WITH(k::relu_backward(ctx, a, b, dx), Contains("relu_backward") && Contains("same shape"));
  CHECK_THROWS_AS(k::tanh_backward(ctx, a, b, dx), shape_error);
  CHECK_THROWS_AS(k::sigmoid_backward(ctx, a, b, dx), shape_error);
  CHECK_THROWS_AS(k::dropout_backward(ctx, a, b, dx), shape_error);
  CHECK_THROWS_WITH(k::dropout_forward(ctx, a, 1.0f, 1, 0, mask, y), Contains("[0, 1)"));
  tensor rm = tensor::zeros({3}), rv = tensor::zeros({3}), m, s;
  CHECK_THROWS_WITH(k::batch_norm_forward_train(ctx, a, tensor::zeros({2}), tensor(), 1e-5f, 0.1f, rm, rv, y, m, s),
                    Contains("gamma"));
  CHECK_THROWS_WITH(k::batch_norm_forward_eval(ctx, tensor::zeros({2, 3, 4}), tensor::zeros({3}), tensor(), 1e-5f, rm, rv, y),
                    Contains("[n, c] or [n, c, h, w]"));
  tensor dg, db;
  CHECK_THROWS_AS(k::batch_norm_backward(ctx, a, tensor::zeros({3}), rm, rv, b, dx, dg, db), shape_error);
}

TEST_CASE("loss, GEMM and optimizer steps reject mismatched shapes", "[kernels][shape]") {
  tensor z = tensor::zeros({2, 3}), out;
  CHECK_THROWS_WITH(k::softmax_cross_entropy(ctx, z, {0}, nullptr), Contains("1 labels for 2 rows"));
  CHECK_THROWS_WITH(k::count_correct(ctx, z, {0, 1, 2}), Contains("3 labels"));
  CHECK_THROWS_WITH(k::matmul(ctx, z, tensor::zeros({2, 3}), out), Contains("inner dimensions"));
  tensor w = tensor::zeros({3}), g = tensor::zeros({4}), v = tensor::zeros({3}), m = tensor::zeros({3});
  CHECK_THROWS_AS(k::sgd_step(ctx, w, g, 0.1f, 0.0f), shape_error);
  CHECK_THROWS_AS(k::momentum_step(ctx, w, tensor::zeros({3}), g, 0.1f, 0.9f, 0.0f, false), shape_error);
  CHECK_THROWS_AS(k::adam_step(ctx, w, g, m, v, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, 1), shape_error);
}
