@0xa68b582cfc85b377;
# Every message between troupe's actors (docs/protocol.md says who sends
# which to whom, and when). A message is one Envelope: its schemaVersion lets
# a peer reject a message of a schema it does not know; its source and
# destination addresses route it, in one process or across nodes.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::wire");

using import "tensor.capnp".Tensor;
using import "tensor.capnp".NamedTensor;

const schemaVersion :UInt16 = 5;  # 5: Metrics.group, Regroup.reports (an allreduce's report count); 4: same-host lanes (message_ref, lane_offer, lane_accept frames); 3: ChaCha20-Poly1305 tags; 2: AES-256-GCM

enum Role {
  coordinator @0;
  loader @1;
  worker @2;
  shard @3;
  stage @4;
  evaluator @5;
  node @6;                           # a node's own control actor: joins, stops
}

# An actor of a run: (node, role, index). The plan says which node hosts it.
struct Address {
  node @0 :UInt32;
  role @1 :Role;
  index @2 :UInt32;
}

struct Envelope {
  schemaVersion @0 :UInt16;
  source @1 :Address;                # who sent it: replies go here
  destination @2 :Address;           # who it is for
  union {
    batch @3 :Batch;
    pullParams @4 :PullParams;
    params @5 :Params;
    pushGradient @6 :PushGradient;
    activation @7 :Activation;
    gradient @8 :Gradient;
    control @9 :Control;
    metrics @10 :Metrics;
    snapshot @11 :Snapshot;
    evaluation @12 :Evaluation;
    collective @13 :Collective;
    regroup @14 :Regroup;
  }
}

# A contiguous range of a model's declared parameter layout: the tensors
# [first, first + shapes.length) of the layout, starting at element `offset`
# of the model's flat parameter buffer, as ONE payload (row-major f32, the
# tensors one after another).
struct FlatTensors {
  first @0 :UInt32;                  # index of the first tensor in the layout
  offset @1 :UInt64;                 # element offset of the range in the flat buffer
  shapes @2 :List(Shape);
  payload @3 :Data;                  # sum of numel(shapes) * 4 bytes
}

struct Shape {
  dims @0 :List(Int64);
}

# A data loader's batch for its worker.
struct Batch {
  epoch @0 :UInt32;
  index @1 :UInt64;
  images @2 :Tensor;                 # [n, sample...]
  labels @3 :List(Int32);            # n labels
}

# A worker (or the evaluator) asks a parameter shard for its current parameters.
struct PullParams {
  shard @0 :UInt32;
  withState @1 :Bool;                # for a checkpoint: the update rule's state too
  steps @2 :UInt64;                  # a pipeline stage answers once it has applied the updates of
                                     # this many mini-batches (a snapshot consistent across stages);
                                     # parameter shards answer at once
}

# A shard's parameters at a version (number of updates it has applied).
struct Params {
  shard @0 :UInt32;
  version @1 :UInt64;
  values @2 :FlatTensors;
  appliedStaleness @3 :UInt64;       # staleness of the push this Params answers (0 for a pull)
  rejected @4 :Bool;                 # the push it answers was rejected and not applied
  ruleState @5 :List(NamedTensor);   # only when the pull asked withState (e.g. "v", "ms/3")
}

# A worker's gradient (or accumulated change, with push-every > 1) for one shard.
struct PushGradient {
  shard @0 :UInt32;
  baseVersion @1 :UInt64;            # the shard version the gradient was computed on
  step @2 :UInt64;                   # the worker's step counter
  values @3 :FlatTensors;
}

# Pipeline stages: activations forward, gradients backward, per micro-batch.
# Micro-batches are numbered over the run: micro-batch i is part i % M of
# mini-batch i / M.
struct Activation {
  microBatch @0 :UInt64;
  stage @1 :UInt32;                  # the stage that made it
  version @2 :UInt64;                # weight version its forward used (weight stashing)
  tensor @3 :Tensor;                 # the stage's output [n, ...]
  labels @4 :List(Int32);            # n labels, for the last stage's loss
}

struct Gradient {
  microBatch @0 :UInt64;
  stage @1 :UInt32;                  # the stage that made it
  tensor @2 :Tensor;                 # d(loss)/d(the receiving stage's output)
}

struct Control {
  kind @0 :Kind;
  detail @1 :Text;
  amount @2 :UInt32;
  enum Kind {
    start @0;                        # coordinator -> worker and its loader: begin training (amount: the epoch)
    stop @1;                         # coordinator -> every actor: stop
    heartbeat @2;
    credit @3;                       # worker -> its loader: `amount` more batches
    error @4;                        # an actor failed; detail says why
    join @5;                         # a node -> the coordinator: its actors exist and its links are up
    lost @6;                         # a node's transport lost node `amount` (detail: why)
    stopped @7;                      # a node -> the coordinator: its actors have stopped
  }
}

# A worker's report of its steps since the last report.
struct Metrics {
  step @0 :UInt64;
  loss @1 :Float32;                  # mean training loss of the batches in this report
  samples @2 :UInt64;
  meanStaleness @3 :Float32;
  maxStaleness @4 :UInt32;
  rejected @5 :UInt32;               # pushes of this report the shards rejected
  stalenessOnly @6 :Bool;            # a hybrid's stage before the last: its pushes' staleness, no step
  computeSeconds @7 :Float64;        # the worker's busy time in these steps (forward, backward, hand-off); 0: not measured
  group @8 :UInt64;                  # an allreduce's: the epoch of the group the step was applied in (0: the first)
}

# Coordinator -> evaluator: take a snapshot of the parameters now (pull every
# shard), evaluate it and, when asked, write a checkpoint.
struct Snapshot {
  epoch @0 :UInt32;                  # 1-based epoch this snapshot closes
  epochsDone @1 :UInt32;             # epochs a resumed run skips (the checkpoint's count)
  steps @2 :UInt64;                  # updates so far
  evaluate @3 :Bool;
  checkpoint @4 :Bool;
  periodic @5 :Bool;                 # a checkpoint between epochs (checkpoint-every-*), not an epoch's record
  epochSamples @6 :UInt64;           # samples of epoch epochsDone + 1 trained so far (a resumed run skips them)
}

# Evaluator -> coordinator: what a Snapshot produced.
struct Evaluation {
  epoch @0 :UInt32;
  testAccuracy @1 :Float64;          # -1 when not evaluated
  checkpointed @2 :Bool;
  periodic @3 :Bool;                 # the answer to a periodic Snapshot
  validationAccuracy @4 :Float64 = -1;  # on the held-out part of the training set; -1 when none
  testLoss @5 :Float64 = -1;         # a language model's mean loss per token; -1 for image models
  validationLoss @6 :Float64 = -1;
  sample @7 :Data;                   # a language model's generated bytes (--sample-tokens); empty: none
}

# One piece of one round of a collective operation among the workers of an
# allreduce (actors/collective_core.hpp): sender and receiver are member ids,
# offset the piece's first element in the operation's buffer.
struct Collective {
  epoch @0 :UInt64;                  # the group's epoch (its membership)
  op @1 :UInt64;                     # the operation's number in the epoch
  kind @2 :UInt8;                    # 0 allreduce, 1 broadcast, 2 barrier
  round @3 :Int32;
  chunk @4 :Int32;
  offset @5 :Int64;
  sender @6 :Int32;
  receiver @7 :Int32;
  bf16 @8 :Bool;                     # payload: bfloat16 values (else float32)
  payload @9 :Data;
}

# An allreduce's group re-formed after a worker was lost or joined again
# (docs/algorithms.md, "Elastic membership"): the coordinator holds the
# workers (phase hold), each reports the global steps it has applied (phase
# report), then the coordinator lets the group go on in its new epoch (phase
# go): a worker one step ahead of `step` rolls that step back, the step after
# `step` is reduced again among `members`, and `joiners` first receive the
# parameters and momentum from member `root` by broadcast.
struct Regroup {
  epoch @0 :UInt64;                  # the group's new epoch
  phase @1 :UInt8;                   # 0 hold, 1 report, 2 go
  step @2 :UInt64;                   # report: the steps the worker has applied; go: the steps every member keeps
  members @3 :List(UInt32);          # go: the workers (their indices) of the new group, in rank order
  joiners @4 :List(UInt32);          # go: those of them that take the parameters from `root`
  root @5 :UInt32;                   # go: the worker whose replica the joiners receive
  reports @6 :UInt64;                # go: the coordinator's count of step reports when the group goes on
}
