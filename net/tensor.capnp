@0xc6569a6c6541c010;
# Tensors as troupe sends and stores them.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::wire");

enum DType {
  f32 @0;
}

struct Tensor {
  shape @0 :List(Int64);
  dtype @1 :DType;
  data @2 :Data;          # little-endian elements, row-major, numel * sizeof(dtype) bytes
}

struct NamedTensor {
  name @0 :Text;
  tensor @1 :Tensor;
}
