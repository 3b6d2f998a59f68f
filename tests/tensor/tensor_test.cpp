#include <catch2/catch.hpp>

#include "tensor/tensor.hpp"
#include "tests/test_util.hpp"

using namespace troupe;
using Catch::Contains;

TEST_CASE("shape basics", "[tensor]") {
  shape s{2, 3, 4};
  CHECK(s.rank() == 3);
  CHECK(s.numel() == 24);
  CHECK(s.to_string() == "[2, 3, 4]");
  CHECK(shape{}.numel() == 1);
  CHECK(shape{2, 0}.numel() == 0);
}

TEST_CASE("tensors are ref-counted, views share storage, clone copies", "[tensor]") {
  tensor t = tensor::from({2, 3}, {1, 2, 3, 4, 5, 6});
  CHECK(t.dev() == device{});
  CHECK(reinterpret_cast<uintptr_t>(t.data()) % 64 == 0);
  tensor v = t.reshape({3, -1});
  CHECK(v.shape() == shape{3, 2});
  CHECK(v.shares_storage(t));
  v.at(0) = 10;
  CHECK(t.at(0) == 10);
  tensor row = t.slice(1, 2);
  CHECK(row.shape() == shape{1, 3});
  CHECK(row.at(0) == 4);
  row.fill(0);
  CHECK(t.to_vector() == std::vector<float>{10, 2, 3, 0, 0, 0});
  tensor c = t.clone();
  CHECK_FALSE(c.shares_storage(t));
  c.at(1) = 99;
  CHECK(t.at(1) == 2);
  tensor z = tensor::zeros({4});
  z.copy_from(tensor::full({2, 2}, 3.0f));
  CHECK(z.to_vector() == std::vector<float>{3, 3, 3, 3});
}

TEST_CASE("a wrapped tensor reads and writes memory it does not own", "[tensor]") {
  std::vector<float> mem{1, 2, 3, 4, 5, 6};
  {
    tensor w = tensor::wrap({2, 3}, mem.data());
    CHECK(w.data() == mem.data());
    CHECK(w.at(4) == 5);
    w.reshape({3, 2}).at(1) = 20;  // views share the memory
    tensor copy = w;
    copy.fill(7);
  }  // the tensors are gone; the memory is still the vector's
  CHECK(mem == std::vector<float>(6, 7.0f));
  CHECK(tensor::wrap({0}, nullptr).numel() == 0);
  CHECK_THROWS_AS(tensor::wrap({2}, nullptr), shape_error);
  CHECK_THROWS_AS(tensor::wrap({-1}, mem.data()), shape_error);
}

TEST_CASE("tensor shape errors are clear", "[tensor]") {
  tensor t = tensor::zeros({2, 3});
  CHECK_THROWS_WITH(t.reshape({4, 2}), Contains("[2, 3]") && Contains("[4, 2]"));
  CHECK_THROWS_WITH(t.reshape({-1, -1}), Contains("more than one -1"));
  CHECK_THROWS_WITH(t.reshape({4, -1}), Contains("cannot be inferred"));
  CHECK_THROWS_AS(t.slice(1, 3), shape_error);
  CHECK_THROWS_AS(tensor::from({2}, {1, 2, 3}), shape_error);
  CHECK_THROWS_AS(tensor::zeros({4}).copy_from(t), shape_error);
  CHECK_THROWS_AS(tensor::empty({2, -1}), shape_error);
}

namespace {
struct counting_allocator : allocator {
  int live = 0;
  void* allocate(std::size_t bytes) override {
    ++live;
    return ::operator new(bytes);
  }
  void deallocate(void* p, std::size_t) noexcept override {
    --live;
    ::operator delete(p);
  }
};
} // namespace

TEST_CASE("allocator seam: tensors take memory from the allocator of their device", "[tensor]") {
  counting_allocator a;
  set_allocator(device_kind::cuda, &a);
  {
    tensor t = tensor::empty({16}, device{device_kind::cuda, 0});
    CHECK(a.live == 1);
    CHECK(t.dev().kind == device_kind::cuda);
    tensor view = t.reshape({4, 4});
    CHECK(a.live == 1);
    // Host-only operations refuse device tensors instead of touching them.
    CHECK_THROWS_WITH(t.fill(0), Contains("cpu tensors only"));
  }
  CHECK(a.live == 0);
  set_allocator(device_kind::cuda, nullptr);
  CHECK_THROWS_WITH(tensor::empty({1}, device{device_kind::cuda, 0}), Contains("no allocator"));
}

TEST_CASE("a read-only wrapped tensor reads memory it must not change, clone() is writable", "[tensor]") {
  const std::vector<float> mem{1, 2, 3, 4, 5, 6};
  {
    tensor r = tensor::wrap_read_only({2, 3}, mem.data());
    const tensor& cr = r;
    CHECK(r.read_only());
    CHECK(cr.data() == mem.data());
    CHECK(cr.at(4) == 5.0f);
    CHECK(r.to_vector() == mem);
    CHECK(r.shape() == shape{2, 3});
    // Every write path through the non-const data() throws troupe::error.
    CHECK_THROWS_MATCHES(r.data(), troupe::error, testing::message(Contains("read-only tensor")));
    CHECK_THROWS_AS(r.at(0), troupe::error);
    CHECK_THROWS_AS(r.fill(0), troupe::error);
    CHECK_THROWS_AS(r.copy_from(tensor::zeros({6})), troupe::error);
    // Views and copies stay read-only.
    tensor v = r.reshape({3, 2});
    CHECK(v.read_only());
    CHECK(static_cast<const tensor&>(v).at(1) == 2.0f);
    CHECK_THROWS_AS(v.data(), troupe::error);
    tensor row = r.slice(1, 2);
    CHECK(row.read_only());
    CHECK(static_cast<const tensor&>(row).data() == mem.data() + 3);
    CHECK_THROWS_AS(row.at(0), troupe::error);
    tensor copy = r;
    CHECK(copy.read_only());
    CHECK(copy.shares_storage(r));
    // A deep copy is the caller's own: writable, and the memory stays as it was.
    tensor c = r.clone();
    CHECK_FALSE(c.read_only());
    CHECK_FALSE(c.shares_storage(r));
    c.at(0) = 10;
    CHECK(c.to_vector() == std::vector<float>{10, 2, 3, 4, 5, 6});
    // It can be read from, e.g. copied into a writable tensor.
    tensor dst = tensor::zeros({6});
    dst.copy_from(r);
    CHECK(dst.to_vector() == mem);
  }
  CHECK(mem == std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK_FALSE(tensor::zeros({2}).read_only());
  CHECK_FALSE(tensor::wrap({1}, const_cast<float*>(mem.data())).read_only());
  CHECK_FALSE(tensor().read_only());
  CHECK(tensor::wrap_read_only({0}, nullptr).numel() == 0);
  CHECK_THROWS_AS(tensor::wrap_read_only({2}, nullptr), shape_error);
  CHECK_THROWS_AS(tensor::wrap_read_only({-1}, mem.data()), shape_error);
}

TEST_CASE("labels per row: one per row, or one per position of a sequence, else none", "[tensor]") {
  CHECK(labels_per_row(shape{4, 784}, 4) == 1);
  CHECK(labels_per_row(shape{4, 1, 28, 28}, 4) == 1);
  CHECK(labels_per_row(shape{4, 16}, 64) == 16);     // windows of 16 tokens
  CHECK(labels_per_row(shape{4, 16, 8}, 64) == 16);  // activations [n, T, features]
  CHECK(labels_per_row(shape{4, 16}, 8) == 0);       // a multiple of n, but neither 1 nor T per row
  CHECK(labels_per_row(shape{4}, 8) == 0);
  CHECK(labels_per_row(shape{4, 16}, 0) == 0);
  CHECK(labels_per_row(shape{}, 0) == 0);
  CHECK(labels_per_row(shape{0, 3}, 0) == 0);
}

TEST_CASE("CPU tensors past the memory limit are an error that names the sizes, and take nothing", "[tensor]") {
  const int64_t before = cpu_memory_limit();
  CHECK(before >= 0);
  const int64_t held = cpu_memory_in_use();
  {
    tensor a = tensor::empty({1000});  // 4000 bytes, 4032 rounded up to whole cache lines
    CHECK(cpu_memory_in_use() == held + 4032);
    set_cpu_memory_limit(held + 4032 + 1000000);
    tensor b = tensor::empty({200000});  // 800 000 bytes: fits
    try {
      tensor::empty({100000});
      FAIL("a tensor past the limit was made");
    } catch (const error& e) {
      CHECK_THAT(e.what(), Contains("out of memory: a tensor of 0.4 MB would bring this process's tensors to") &&
                               Contains("it may hold (set by the program): a smaller batch or model needs less"));
    }
    CHECK(cpu_memory_in_use() == held + 4032 + 800000);  // the refused tensor took nothing
    set_cpu_memory_limit(0);                            // no limit
    CHECK_NOTHROW(tensor::empty({100000}));
  }
  CHECK(cpu_memory_in_use() == held);  // every tensor's bytes given back
  set_cpu_memory_limit(before);
}
