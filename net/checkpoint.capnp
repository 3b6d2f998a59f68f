@0xa9e2804930f11eef;
# A training checkpoint: model parameters (and buffers) plus optimizer state.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::wire");

using import "tensor.capnp".NamedTensor;

struct Checkpoint {
  formatVersion @0 :UInt32;      # 1
  architecture @1 :Text;         # model::architecture(): loading into another model fails
  epoch @2 :UInt32;              # epochs completed
  step @3 :UInt64;               # optimizer steps taken
  params @4 :List(NamedTensor);  # parameters and buffers (model::state())
  optimizer @5 :List(NamedTensor);
  optimizerKind @6 :Text;        # the optimizer, or the asynchronous algorithm whose rule state `optimizer` holds
  shardVersions @7 :List(UInt64); # asynchronous runs: each parameter shard's version (updates applied)
}
