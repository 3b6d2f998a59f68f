@0xa68b582cfc85b377;
# Every message between troupe's actors. A message is one Envelope; its
# schemaVersion lets a peer reject a message of a schema it does not know.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::wire");

using import "tensor.capnp".Tensor;
using import "tensor.capnp".NamedTensor;

const schemaVersion :UInt16 = 1;

struct Envelope {
  schemaVersion @0 :UInt16;
  sender @1 :UInt32;                 # actor or node id of the sender
  union {
    batch @2 :Batch;
    pullParams @3 :PullParams;
    params @4 :Params;
    pushGradient @5 :PushGradient;
    activation @6 :Activation;
    gradient @7 :Gradient;
    control @8 :Control;
    metrics @9 :Metrics;
  }
}

# Sender id of the coordinator (workers are 0..N-1).
const coordinatorId :UInt32 = 0xffffffff;

# A data loader's batch for a worker.
struct Batch {
  epoch @0 :UInt32;
  index @1 :UInt64;
  images @2 :Tensor;                 # [n, c, h, w]
  labels @3 :List(Int32);            # n labels
}

# A worker asks a parameter shard for its current parameters.
struct PullParams {
  worker @0 :UInt32;
  shard @1 :UInt32;
  withState @2 :Bool;                # the coordinator, for a checkpoint: the update rule's state too
}

# A shard's parameters at a version (number of updates it has applied).
struct Params {
  shard @0 :UInt32;
  version @1 :UInt64;
  tensors @2 :List(Tensor);
  appliedStaleness @3 :UInt64;       # staleness of the push this Params answers (0 for a pull)
  rejected @4 :Bool;                 # the push it answers was rejected and not applied
  ruleState @5 :List(NamedTensor);   # only when the pull asked withState (e.g. "v", "ms/3")
}

# A worker's gradient (or accumulated change, with push-every > 1) for one shard.
struct PushGradient {
  worker @0 :UInt32;
  shard @1 :UInt32;
  baseVersion @2 :UInt64;            # the shard version the gradient was computed on
  step @3 :UInt64;                   # the worker's step counter
  tensors @4 :List(Tensor);
}

# Pipeline stages: activations forward, gradients backward, per micro-batch.
struct Activation {
  microBatch @0 :UInt64;
  stage @1 :UInt32;
  version @2 :UInt64;                # weight version used (weight stashing)
  tensor @3 :Tensor;
}

struct Gradient {
  microBatch @0 :UInt64;
  stage @1 :UInt32;
  tensor @2 :Tensor;
}

struct Control {
  kind @0 :Kind;
  node @1 :UInt32;
  detail @2 :Text;
  enum Kind {
    join @0;
    stop @1;
    heartbeat @2;
    credit @3;                       # a worker may receive `amount` more batches
    error @4;                        # an actor failed; detail says why
  }
  amount @3 :UInt32;
}

struct Metrics {
  worker @0 :UInt32;
  step @1 :UInt64;
  loss @2 :Float32;
  samples @3 :UInt64;
  meanStaleness @4 :Float32;
  maxStaleness @5 :UInt32;
  rejected @6 :UInt32;               # pushes of this step the shards rejected
}
