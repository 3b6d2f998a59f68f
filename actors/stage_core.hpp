#pragma once

// A pipeline stage: layers [first, last) of the model, its parameters and
// their optimizer, and the schedule it follows (model/schedule.hpp). It takes
// Batch (the first stage), Activation and Gradient messages, runs every
// action of its schedule whose input is there, and returns the messages to
// send on. The stage is one model (its layers); each micro-batch in flight
// has its own activations (model::activations), and the stage's layers write
// their outputs straight into the messages that carry them on (forward) and
// back (backward). 1F1B keeps, per micro-batch, the weight version its forward
// used, so that its backward uses the same (weight stashing). Its parameters
// are a param_holder (versions a micro-batch holds never change); its
// updates come from a stage_weights strategy: its own optimizer, or a
// hybrid's (D replicas of the pipeline) shard, or allreduce with the other
// replicas' stage k.

#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <vector>

#include "actors/collective_core.hpp"
#include "actors/param_holder.hpp"
#include "actors/stage_weights.hpp"
#include "actors/param_client.hpp"
#include "kernels/context.hpp"
#include "model/flat_optimizer.hpp"
#include "model/model.hpp"
#include "model/schedule.hpp"
#include "net/message.hpp"
#include "train/epoch_accumulator.hpp"
#include "train/plan.hpp"
#include "train/trace.hpp"

namespace troupe::actors {

struct stage_config {
  train::stage_plan plan;
  int index = 0, stages = 1;         ///< k of K
  net::address previous, next;       ///< the neighbouring stages (unused at the ends)
  net::address coordinator;          ///< the last stage reports each mini-batch to it
  /// A hybrid's stage (plan.shard >= 0): the shard its gradients go to, one
  /// push per mini-batch; its Params answer, and the next mini-batch's
  /// forwards wait for it. The stage's own optimizer (sgd) is unused.
  net::address shard;
  model::param_layout layout;        ///< the whole model's
  model::pipeline_schedule schedule = model::pipeline_schedule::gpipe;
  int micro_batches = 4;
  int64_t total_micro_batches = 0;   ///< of the run
  /// 1F1B: where the pipeline drains (model::pipeline_program's flush_after).
  std::vector<int64_t> flush_after;
  /// The optimizer of the stage's own parameters (total_steps: mini-batches of the run).
  model::flat_optimizer_options opt;
  int64_t steps_before = 0;          ///< mini-batches done before this start (a resumed run)
  int stash = 0;                     ///< 1F1B: weight versions kept (0: every one in flight)
  /// An allreduce's hybrid: stage k of every pipeline replica, by replica (this
  /// stage is `member`); each mini-batch's gradient is averaged over them
  /// before the update, and the next forwards wait for it. Empty: none.
  std::vector<net::address> peers;
  int32_t member = 0;
  /// A snapshot's PullParams counts the mini-batches of this many replicas.
  int snapshot_replicas = 1;
  /// > 0: each update's gradient is clipped to this global norm, the whole
  /// model's: the squares of the K stages' norms are summed by an allreduce
  /// among `pipeline` (stages 0..K-1 of this replica, in order) first. In a
  /// hybrid by allreduce, of the gradient averaged over the replicas (the
  /// same norm on every replica); on shards, of this replica's own, as a
  /// data-parallel worker clips its own before it pushes.
  float clip_grad_norm = 0;
  std::vector<net::address> pipeline;
  std::shared_ptr<train::tracer> trace;
};

class stage_core {
public:
  /// `net` is the built stage model (the model's layers [first, last), as
  /// model::slice cuts them); `initial` holds its parameters (the stage's
  /// range of the layout). Its parameters are bound to the weight version
  /// of each action (model::bind): their own values go unused.
  stage_core(stage_config c, model::model net, std::vector<float> initial);

  /// A hybrid's stage: the pull of its shard's parameters and version (the
  /// weights it starts from, those of a resumed run too); its first forward
  /// waits for the answer. Empty for other stages and after the first call.
  std::vector<outgoing> start();
  /// A Batch (first stage), Activation or Gradient: kept until its action runs;
  /// a hybrid's Params (the shard's answer to its push): its weights from now on.
  /// Throws net::message_error for one that does not fit. The message is
  /// opened once (open()): its actions read the kept, checked view.
  void take(const net::opened_message& r);
  void take(const net::message& m) { take(open(m)); }
  /// `m` opened and validated with this stage's limits and finite-value scan;
  /// throws net::message_error.
  net::opened_message open(const net::message& m) const;
  /// A PullParams: answered at once (returned) when the stage has applied the
  /// updates of the mini-batches it asks for (PullParams.steps), else kept
  /// and answered by the run() that applies them: an epoch's snapshot holds
  /// every stage's parameters after the same mini-batches, the last update of
  /// the first stage included.
  std::vector<outgoing> take_pull(const net::opened_message& r);
  std::vector<outgoing> take_pull(const net::message& m) { return take_pull(open(m)); }
  /// Continues from a checkpoint's optimizer state (model::flat_optimizer's),
  /// which answer_pull sends with a pull that asks for the state. Throws
  /// troupe::error when its size is not the stage's.
  void restore(const std::vector<named_tensor>& state);
  /// Mini-batches whose updates this stage has applied (1F1B: an update per micro-batch).
  int64_t applied_mini_batches() const;

  struct result {
    std::vector<outgoing> messages;            ///< activations on, gradients back
    /// The last stage: one per finished mini-batch. A hybrid's other stages:
    /// the staleness of their pushes answered since the last (staleness_only).
    std::vector<train::step_report> reports;
    int actions = 0;                           ///< actions run
    model::pipeline_action::kind last = model::pipeline_action::kind::forward;  ///< the last action's kind
    int64_t last_micro_batch = -1;             ///< and its micro-batch (-1: an update)
  };
  /// Runs the schedule's actions while their inputs are here, at most
  /// `max_actions` of them (an actor runs one at a time and sends its output
  /// at once, so that the next stage starts while this one goes on).
  result run(int max_actions = std::numeric_limits<int>::max());

  bool done() const { return program_.done(); }
  /// True when the next action waits for an input that is not here.
  bool waiting() const { return !done() && !ready(program_.peek()); }
  /// The mini-batch the next forward needs (first stage), or -1.
  int64_t needed_batch() const;
  /// Micro-batches forwarded and not yet backwarded: now, and the most so far.
  int in_flight() const { return static_cast<int>(flight_.size()); }
  int max_in_flight() const { return max_in_flight_; }
  /// The schedule's bound on in_flight() (1F1B: K - k; GPipe: M).
  int bound() const { return program_.bound(); }
  uint64_t version() const { return holder_.version(); }
  /// Mini-batches whose every micro-batch the first stage has forwarded (each frees a loader credit).
  int64_t batches_taken() const { return batches_taken_; }
  const net::address& address() const { return c_.plan.address; }
  const stage_config& config() const { return c_; }

private:
  using weights = param_holder::held;  // a version: never written while it is held
  /// A Batch, Activation or Gradient read once when it came: its tensor in
  /// place (the message is kept with it) and its labels.
  struct input {
    net::opened_message msg;
    net::tensor_view x;
    std::vector<int32_t> labels;
  };
  struct flight {
    model::activations act;        // what its forward keeps for its backward
    weights w;
    input in;                      // its payload is the forward's input: kept until the backward
    net::message sent;             // the Activation sent on: its payload is the last layer's output
    tensor dlogits;                // the last stage: d(loss)/d(logits)
  };
  /// An Activation or Gradient under construction, its tensor left to write.
  struct tensor_message {
    std::unique_ptr<capnp::MallocMessageBuilder> builder;
    tensor payload;                    // the message's tensor, in place (written whole by a layer)
    std::shared_ptr<const void> keep;  // a large payload's buffer (net::written_blob)
    net::message finish() { return net::message::from_builder(std::move(builder), std::move(keep)); }
  };

  bool first() const { return c_.index == 0; }
  bool last() const { return c_.index + 1 == c_.stages; }
  bool ready(const model::pipeline_action& a) const;
  void forward(int64_t mb, result& out);
  void backward(int64_t mb, result& out);
  void update(int64_t mb, result& out);
  /// An update applied to holder_: the stash and the pulls it makes due.
  void updated(std::vector<outgoing>& out);
  /// The strategy's reduction of the update's gradient is done: the norm (clipping), then apply.
  void reduced(std::vector<outgoing>& out);
  /// The mean gradient of mini-batch step_ to the strategy.
  void apply(std::vector<outgoing>& out);
  /// Clipping: a Collective piece of the norm's sum among the pipeline's stages.
  void take_norm(const net::envelope_reader& r);
  /// The whole model's norm is known: the gradient clipped, then applied.
  void clip_and_apply(std::vector<outgoing>& out);
  /// Activations for a micro-batch: a spare one (its buffers kept) or new.
  model::activations take_activations();
  /// This stage's parameters now, for the PullParams `m`.
  outgoing answer_pull(const net::envelope_reader& r);
  /// The kept pulls that the updates applied so far answer.
  void answer_due_pulls(std::vector<outgoing>& out);
  /// A message to `to` for micro-batch `mb` with a tensor of shape `s` (and an Activation's labels).
  tensor_message start_tensor_message(wire::Envelope::Which kind, const net::address& to, int64_t mb, const shape& s,
                                      const std::vector<int32_t>* labels) const;

  stage_config c_;
  model::model net_;                                 // the stage's layers
  std::vector<model::activations> spare_;            // activations of micro-batches done, for the next
  kernels::context ctx_;
  model::pipeline_program program_;
  std::string track_;
  param_holder holder_;                              // its parameters, and the pulls kept
  std::unique_ptr<stage_weights> weights_;           // where its updates come from
  std::deque<weights> stash_;                        // 1F1B: versions kept, oldest first
  std::vector<float> grads_;                         // gradients summed (GPipe) or the last (1F1B)
  std::vector<float> call_grads_;                    // one backward's gradients, where it writes them
  std::vector<outgoing> weights_out_;                // the strategy's answers to take(), sent by the next run()
  bool updated_ = false;                             // take() completed an update: run() answers the pulls due
  std::unique_ptr<collective_core> norm_group_;      // clipping: the pipeline's stages, summing their norms
  float norm_sq_ = 0;                                // this stage's squared gradient norm, then the sum
  bool norming_ = false;                             // the norm's sum is under way: no action runs
  int64_t step_ = 0;                                 // the mini-batch of the update under way
  int64_t updates_ = 0;                              // updates applied (with those before a resume)
  bool empty_update_ = false;                        // the update's stage has no parameters (or samples)
  int64_t summed_ = 0;                               // samples whose gradients grads_ sums
  int64_t last_backward_ = 0;
  std::map<int64_t, input> batches_;                 // first stage: mini-batch -> Batch
  std::map<int64_t, input> activations_, gradients_;  // micro-batch -> message
  std::map<int64_t, flight> flight_;
  std::map<int64_t, std::pair<double, int64_t>> losses_;      // last stage: mini-batch -> (loss sum, samples)
  std::map<int64_t, int> done_in_batch_;                      // last stage: micro-batches backwarded per mini-batch
  int max_in_flight_ = 0;
  int64_t batches_taken_ = 0;
};

/// The pace of an emulated slower device (--device-speeds): how long a stage
/// holds each action's output after computing it here. With measured costs,
/// until the action has lasted its device's time (stage_plan::fwd_action_s,
/// bwd_action_s; an update is part of the backward's time), on average: the
/// time the device fell behind (a timer that fired late, an update computed
/// here) is taken off the next holds. Without them, (slowdown - 1) x the
/// compute. A device at full speed never holds.
class device_pace {
public:
  explicit device_pace(const train::stage_plan& p)
      : slowdown_(p.slowdown), fwd_action_s_(p.fwd_action_s), bwd_action_s_(p.bwd_action_s) {}
  bool holds() const { return slowdown_ > 1.0f; }
  /// The hold after an action of kind `what` that took `compute` seconds here.
  double hold(model::pipeline_action::kind what, double compute);
  /// The last hold ended `overshoot` seconds after it was due.
  void ended_late(double overshoot);
  /// Seconds the device is behind its pace.
  double behind() const { return behind_; }

private:
  float slowdown_;                     ///< the stage's device: this many times slower than here
  double fwd_action_s_, bwd_action_s_;  ///< its actions' device times; 0: not measured
  double behind_ = 0;
};

} // namespace troupe::actors
