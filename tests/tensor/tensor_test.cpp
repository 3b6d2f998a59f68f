#include <catch2/catch.hpp>
#include "tensor/tensor.hpp"
using namespace troupe;
TEST_CASE("tensor basics") { auto t = tensor::zeros({2,3}); CHECK(t.numel()==6); }
