@0xa9e2804930f11eef;
# A training checkpoint: model parameters (and buffers) plus optimizer state.
#
# The file (format 2 on) is two Cap'n Proto messages, one after the other: a
# Checkpoint, then a CheckpointSeal holding the SHA-256 of the Checkpoint
# message's bytes as stored (its segment table included). A loader verifies the
# seal before it reads anything of the Checkpoint. Format 1 files (troupe before
# the seal) are the Checkpoint message alone; they load unverified.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::wire");

using import "tensor.capnp".NamedTensor;

struct Checkpoint {
  formatVersion @0 :UInt32;      # 2 (1: written before the seal)
  architecture @1 :Text;         # model::architecture(): loading into another model fails
  epoch @2 :UInt32;              # epochs completed
  step @3 :UInt64;               # optimizer steps taken
  params @4 :List(NamedTensor);  # parameters and buffers (model::state())
  optimizer @5 :List(NamedTensor);
  optimizerKind @6 :Text;        # the optimizer, or the asynchronous algorithm whose rule state `optimizer` holds
  shardVersions @7 :List(UInt64); # asynchronous runs: each parameter shard's version (updates applied)
  epochSamples @8 :UInt64;       # samples of epoch `epoch` + 1 already trained (a checkpoint inside an epoch): a resumed run goes on from there
  vocabulary @9 :Data;           # a language model's tokens: byte i of it is token i (empty: not a language model)
}

# Follows the Checkpoint message in the file.
struct CheckpointSeal {
  sha256 @0 :Data;               # SHA-256 of the Checkpoint message's bytes as stored
  bytes @1 :UInt64;              # how many bytes that is
}
