#pragma once

// A data-parallel worker: trains on the batches of its loader with a model
// replica borrowed per step, and gets its weights from (and sends its update
// to) one of three small parts: the parameter shards every step, the shards
// every k local steps, or a Hogwild! buffer shared in this process.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "actors/param_client.hpp"
#include "kernels/context.hpp"
#include "model/model.hpp"
#include "model/optimizer.hpp"
#include "net/message.hpp"
#include "train/epoch_accumulator.hpp"
#include "train/plan.hpp"
#include "train/trace.hpp"

namespace troupe::actors {

/// A model replica whose parameters live in one flat buffer of values and one
/// of gradients, in the model's layout order.
struct replica {
  model::model net;
  model::model::flat_buffers flat;
};

/// Model replicas shared by the workers of one process. A worker borrows a
/// replica (its activation and gradient buffers) for one step, so memory grows
/// with the steps that run at once, not with the number of workers. Thread-safe.
class replica_pool {
public:
  /// `make` returns a built model; every replica must have the same layout.
  explicit replica_pool(std::function<model::model()> make) : make_(std::move(make)) {}
  replica* acquire();
  void release(replica* r);
  /// Replicas created so far.
  std::size_t size() const;

private:
  std::function<model::model()> make_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<replica>> all_;
  std::vector<replica*> free_;
};

/// The parameters Hogwild! workers of one process share: one flat buffer that
/// every worker reads and updates without locks. The races between workers
/// are the algorithm; each element is a relaxed atomic, so that they are
/// well-defined races (no torn floats, no undefined behaviour) and cost plain
/// loads and stores. `updates` gives each update its staleness.
class hogwild_store {
public:
  hogwild_store(const float* init, int64_t n);
  int64_t size() const { return n_; }
  void read(float* out) const;
  /// w -= lr * g, element by element, racing with the other workers.
  void subtract(float lr, const float* g);
  std::atomic<uint64_t> updates{0};

private:
  std::unique_ptr<std::atomic<float>[]> w_;
  int64_t n_;
};

/// Points a replica's tensors at memory it does not own for one step, and
/// gives them their own tensors back at the end.
class bound_tensors {
public:
  bound_tensors() = default;
  bound_tensors(const bound_tensors&) = delete;
  bound_tensors& operator=(const bound_tensors&) = delete;
  ~bound_tensors();
  void bind(tensor& slot, const shape& s, float* data);
  void bind_read_only(tensor& slot, const shape& s, const float* data);

private:
  std::vector<tensor*> slots_;
  std::vector<tensor> own_;
};

/// The layer of each of `net`'s parameter tensors, in the layout's order.
std::vector<std::size_t> layer_of_each_tensor(const model::model& net);

/// Where a worker's weights come from and where its update goes.
class weight_source {
public:
  virtual ~weight_source() = default;
  /// The first messages: a PullParams to every shard.
  virtual std::vector<outgoing> start() { return {}; }
  /// Pulls for the shards whose answer has not come (a push or its reply lost
  /// on the way): their Params let the worker go on.
  virtual std::vector<outgoing> retry() { return {}; }
  /// A shard's Params reply. Throws net::message_error for one that does not fit.
  virtual void on_params(const net::opened_message& m);
  /// A piece of a collective (allreduce): the messages to send in answer.
  /// Throws net::message_error for a source that takes none.
  virtual std::vector<outgoing> on_collective(const net::opened_message& m);
  /// The evaluator's PullParams to a worker that holds the parameters
  /// (allreduce's first): its answer, now or once due. Throws
  /// net::message_error for a source that holds none.
  virtual std::vector<outgoing> on_pull(const net::opened_message& m);
  /// The coordinator re-forms an allreduce's group (Regroup): the messages to
  /// send in answer. Throws net::message_error for a source that is in none.
  virtual std::vector<outgoing> on_regroup(const net::opened_message& m);
  /// True when a step may start: weights present, no push unanswered.
  virtual bool ready() const = 0;
  /// Called once with a replica's model, before the first step.
  virtual void attach(const model::model& net) {}
  /// A step of epoch `epoch` (its Batch's) begins, and the step before was
  /// of another epoch, or none: the parameters are those at the end of the
  /// epoch before (a holder keeps them for that epoch's snapshot).
  virtual void epoch_starts(uint32_t epoch) {}
  /// Whether the weights of layer `layer` are here (receiving per layer: the
  /// step's forward pass runs each layer as soon as they are).
  virtual bool has_layer(std::size_t layer) const { return ready(); }
  /// During a step paused for weights: binds those that arrived since bind().
  virtual void bind_arrived(replica& r, bound_tensors& b) {}
  /// Before forward: the replica's parameters hold, or view, this step's
  /// weights (those that have come, receiving per layer); its gradients are
  /// where backward should write them.
  virtual void bind(replica& r, bound_tensors& b) = 0;
  /// After backward: applies the update or appends the pushes for the shards to `out`
  /// (those after_layer has not sent).
  virtual void update(const kernels::context& ctx, replica& r, uint64_t step, std::vector<outgoing>& out) = 0;
  /// True when after_layer sends pushes during backward (pipelined execution).
  virtual bool pushes_during_backward() const { return false; }
  /// During backward, once layer `layer` (and every layer after it) is done:
  /// appends the pushes of the shards whose gradients are complete to `out`.
  virtual void after_layer(std::size_t layer, uint64_t step, std::vector<outgoing>& out) {}
  /// During backward: an operation is under way that messages to this worker
  /// move on (an allreduce's pieces), so the step lets them in between layers
  /// (worker_core::yield_in_backward).
  virtual bool wants_messages() const { return false; }
  /// An allreduce's: the epoch of the group its steps are now applied in
  /// (its reports say so: step_report::group). 0 for the others.
  virtual uint64_t group_epoch() const { return 0; }
  /// True when an update was applied, or a push answered by every shard, since the last report.
  bool report_due() const { return report_due_; }
  /// The tally since the last report; starts a new one.
  staleness_tally take_tally();

protected:
  staleness_tally tally_;
  bool report_due_ = false;
};

/// What the shard-based sources need to know.
struct shard_source_config {
  net::address self;
  std::vector<train::shard_plan> shards;
  model::param_layout layout;
  /// > 0: each step's gradient is clipped to this global norm (the whole
  /// model's, over every shard's part) before it is pushed or applied; the
  /// pushes then wait for the whole backward (no overlap).
  float clip_grad_norm = 0;
};
/// Push every step: the replica reads its weights in place from the shards'
/// Params and backward writes its gradients in place into the pushes.
std::unique_ptr<weight_source> shard_weights(const shard_source_config& c);
/// A local optimizer: k steps on the worker's own copy, then the accumulated
/// change (as a gradient at lr) goes to the shards (multi-granular updates).
std::unique_ptr<weight_source> local_steps(const shard_source_config& c, int k, float lr, float momentum);
/// Hogwild!: reads and updates `store` directly, lr from the server's
/// schedule over `total_updates` (after `warmup` updates of warm-up).
/// clip_grad_norm > 0: each update's gradient clipped to that global norm first.
std::unique_ptr<weight_source> hogwild_weights(std::shared_ptr<hogwild_store> store, float lr,
                                               model::lr_schedule schedule, int64_t total_updates,
                                               int64_t warmup = 0, float clip_grad_norm = 0);

/// A worker: steps on Batch messages with a borrowed replica and its weight source.
class worker_core {
public:
  worker_core(const train::worker_plan& p, std::shared_ptr<replica_pool> pool, std::unique_ptr<weight_source> source);
  ~worker_core();

  std::vector<outgoing> start() { return source_->start(); }
  /// Pulls for the shards whose answer is missing (see weight_source::retry).
  std::vector<outgoing> retry() { return source_->retry(); }
  /// A shard's Params. Throws net::message_error for a message that does not fit.
  void on_params(const net::opened_message& m) { source_->on_params(m); }
  void on_params(const net::message& m) { on_params(open(m)); }
  /// A collective's piece (allreduce); the messages to send in answer.
  std::vector<outgoing> on_collective(const net::opened_message& m) { return source_->on_collective(m); }
  /// The evaluator's pull of a worker that holds the parameters.
  std::vector<outgoing> on_pull(const net::opened_message& m) { return source_->on_pull(m); }
  /// The coordinator re-forms the allreduce's group.
  std::vector<outgoing> on_regroup(const net::opened_message& m) { return source_->on_regroup(m); }
  /// `m` opened and validated once, with the worker's limits and finite-value
  /// scan (its threads); throws net::message_error. The worker's actor opens
  /// every message so, and its handlers read the checked view.
  net::opened_message open(const net::message& m) const;
  /// Every shard's weights are here and no push is unanswered.
  bool ready() const { return source_->ready(); }
  /// A step may start: none is paused, and the weights are here (receiving
  /// per layer: those of the first layer).
  bool can_step() const;
  /// A step waits for a shard's weights (receiving per layer).
  bool paused() const { return run_ != nullptr; }
  /// The paused step's next layer has its weights (a forward pass paused for them).
  bool can_resume() const;
  /// The step's backward let messages in: go_on() once they are handled.
  bool yielded() const;

  struct step_out {
    double loss = 0;
    std::vector<outgoing> pushes;  ///< empty between pushes (and those sent during backward)
    int sent_during_backward = 0;  ///< pushes handed to the sender while backward went on
    bool paused = false;           ///< the forward pass waits for weights: resume() once can_resume()
    bool yielded = false;          ///< backward lets messages in: go_on() once those that came are handled
  };
  /// Trains on one Batch message. Requires can_step().
  step_out step(const net::opened_message& batch);
  step_out step(const net::message& batch) { return step(open(batch)); }
  /// Goes on with a paused step. Requires can_resume().
  step_out resume();
  /// Goes on with the backward of a step that let messages in. Requires yielded().
  step_out go_on();
  /// With overlap's sender: after each layer of backward while the weight
  /// source has an operation under way that messages move on (an allreduce's
  /// pieces of a bucket reduced during backward), the step returns with
  /// step_out::yielded, so that the worker's actor handles the messages that
  /// have come (the operation goes on, the next bucket starts) before go_on().
  /// Without it those messages wait for the whole backward. Off by default.
  void yield_in_backward(bool on) { yield_ = on; }
  /// Pipelined execution: each parameter shard's push goes to `send` as soon
  /// as backward has produced its gradients, while backward goes on with the
  /// layers before (P3's overlap of communication with backward). Without a
  /// sender (the default), every push waits for the whole backward (linear
  /// execution). Only the push-every-step source overlaps.
  /// `receive`: the receiving side too (P3's): the forward pass runs each
  /// layer as soon as its shard's weights arrive, pausing (step_out::paused)
  /// until they do, and each push carries its shard's index as its priority,
  /// so that the first layers' gradients (and weights) overtake the others
  /// waiting for the same link.
  void overlap(std::function<void(outgoing&&)> send, bool receive = true) {
    send_ = std::move(send);
    receive_ = receive && source_->pushes_during_backward();
  }
  /// The run's timeline: spans forward, backward and push on `track`.
  void trace(std::shared_ptr<train::tracer> t, std::string track) {
    trace_ = std::move(t);
    track_ = std::move(track);
  }
  /// A span `name` on this worker's track (nothing without a trace).
  void trace_span(const char* name, std::chrono::steady_clock::time_point begin,
                  std::chrono::steady_clock::time_point end) const {
    if (trace_) trace_->span(track_, name, begin, end);
  }
  /// True when report() has something to say.
  bool report_due() const { return source_->report_due(); }
  /// The steps since the last report.
  train::step_report report();

  const net::address& address() const { return p_.address; }
  const train::worker_plan& plan() const { return p_; }

private:
  struct running;  // a step between its batch and its pushes
  /// Runs the step's forward pass on as far as the weights allow, then the rest of the step.
  step_out advance();
  step_out advance_step();
  /// Backward from where the step is, with the pushes sent during it when
  /// overlapping; false when it lets messages in before it is done.
  bool backward(running& s);

  train::worker_plan p_;
  std::shared_ptr<replica_pool> pool_;
  std::unique_ptr<weight_source> source_;
  kernels::context ctx_;
  shape input_;
  uint64_t steps_ = 0;
  int64_t epoch_ = -1;  // the last step's Batch's epoch (-1: none yet)
  tensor dlogits_;
  std::vector<int32_t> labels_;
  double loss_sum_ = 0;
  double compute_s_ = 0;  // busy in advance() since the last report
  uint64_t samples_ = 0, loss_n_ = 0;
  std::function<void(outgoing&&)> send_;
  bool receive_ = false;
  bool yield_ = false;
  std::unique_ptr<running> run_;
  std::shared_ptr<train::tracer> trace_;
  std::string track_;
};

} // namespace troupe::actors
