#pragma once

// The parameter-server roles (data loader, worker, parameter shard) as plain
// objects that take and return net::message values. The CAF actors in
// actors/ps_actors.cpp only move these messages between mailboxes and call
// these objects, so every decision here is tested without an actor runtime,
// and nothing here assumes that the peers share a process.

#include <atomic>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.hpp"
#include "model/model.hpp"
#include "model/optimizer.hpp"
#include "model/update_rule.hpp"
#include "net/checkpoint.hpp"
#include "net/message.hpp"

namespace troupe::actors {

/// Sender id the coordinator uses in PullParams (workers are 0..N-1).
constexpr uint32_t coordinator_id = 0xffffffffu;

/// Which shard owns each parameter tensor, balanced by size: largest tensor
/// first, each to the shard holding the fewest elements so far.
struct shard_plan {
  int shards = 0;
  std::vector<int> owner;                 ///< per parameter index
  std::vector<std::vector<int>> members;  ///< per shard, its parameter indices in model order
  std::vector<int64_t> elements;          ///< per shard, total elements
};
/// Throws troupe::error when `shards` < 1 or exceeds the number of tensors.
shard_plan plan_shards(const std::vector<int64_t>& tensor_sizes, int shards);

// --- message builders (every message starts with the schema version) ---
/// `with_state`: the reply carries the update rule's state too (checkpoints).
net::message make_pull(uint32_t sender, uint32_t shard, bool with_state = false);
net::message make_control(uint32_t sender, wire::Control::Kind kind, uint32_t amount = 0,
                          const std::string& detail = {});
struct step_report {
  uint32_t worker = 0;
  uint64_t step = 0;        ///< pushes (or local steps) so far
  float loss = 0;           ///< mean training loss of the batches in this report
  uint64_t samples = 0;     ///< samples trained in this report
  float mean_staleness = 0; ///< over the shards that applied this push
  uint32_t max_staleness = 0;
  uint32_t rejected = 0;
};
net::message make_metrics(const step_report& r);
/// Copies the tensors of shard p.getShard() into `into` (all of the model's
/// tensors, in model order) at the places `plan` gives them. Throws
/// net::message_error for an unknown shard or tensors of the wrong shapes.
uint32_t copy_shard_params(wire::Params::Reader p, const shard_plan& plan, const std::vector<tensor*>& into);
/// The checks of copy_shard_params without the copy: the shard exists and its
/// tensors have the shapes of `like`'s members. Returns the shard.
uint32_t check_shard_params(wire::Params::Reader p, const shard_plan& plan, const std::vector<tensor*>& like);
step_report read_metrics(wire::Metrics::Reader m, uint32_t sender);

/// A data loader: one shard [begin, end) of the training set, reshuffled every
/// epoch from (seed, epoch); hands out Batch messages without end (the epochs
/// roll over), so the coordinator alone decides when training stops.
class loader_core {
public:
  loader_core(const data::image_dataset& ds, const data::normalization& norm, int64_t batch_size,
              uint64_t seed, int64_t begin, int64_t end, uint32_t id, int first_epoch = 0);
  net::message next();
  int epoch() const { return epoch_; }
  int64_t batches_per_epoch() const { return batches_.batches_per_epoch(); }

private:
  data::batcher batches_;
  data::batch tmp_;  // its images view the message being built while next() fills it
  shape sample_;     // [c, h, w]
  uint32_t id_;
  int epoch_ = 0;
  uint64_t index_ = 0;
};

/// Parameters shared by Hogwild! workers of one process: one buffer, updated
/// without locks (the races are the algorithm), and an update counter that
/// gives each update its staleness.
struct hogwild_store {
  std::vector<std::vector<float>> params;  ///< per parameter tensor
  std::atomic<uint64_t> updates{0};
};

/// Model replicas shared by the workers of one process. A worker keeps only its
/// parameters and borrows a replica (the activation and gradient buffers) for
/// one step, so memory grows with the steps that run at once (the scheduler's
/// threads), not with the number of workers. Thread-safe.
class replica_pool {
public:
  /// `make` returns a built model; every replica must have the same parameters.
  explicit replica_pool(std::function<model::model()> make) : make_(std::move(make)) {}
  model::model* acquire();
  void release(model::model* m);
  /// Replicas created so far.
  std::size_t size() const;

private:
  std::function<model::model()> make_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<model::model>> all_;
  std::vector<model::model*> free_;
};

struct worker_config {
  uint32_t id = 0;
  int push_every = 1;         ///< k local steps per push (multi-granular updates)
  float worker_lr = 0.05f;    ///< local optimizer when push_every > 1
  float worker_momentum = 0;  ///< local optimizer when push_every > 1
  int threads = 1;            ///< kernel threads of this worker
  // Hogwild! only: the shared store and the server's learning-rate schedule.
  hogwild_store* hogwild = nullptr;
  float lr = 0.05f;
  std::string lr_schedule = "constant";
  int64_t total_updates = 1;
};

/// A worker: its own parameters, a replica borrowed per step. Parameter-server mode: pull() → on_params() for every
/// shard → step() on batches; after every push_every-th step it returns one
/// PushGradient per shard and waits for their Params replies. Hogwild! mode:
/// step() reads and updates the shared store directly.
class worker_core {
public:
  worker_core(std::shared_ptr<replica_pool> replicas, shard_plan plan, worker_config c);
  ~worker_core();

  /// PullParams for every shard (the first parameters).
  std::vector<net::message> pull() const;
  /// Takes one shard's Params. Throws net::message_error for a message that
  /// does not fit (it is not applied). True when every shard has answered.
  bool on_params(const net::message& m);
  /// True when the replica holds parameters from every shard and no push is unanswered.
  bool ready() const { return hogwild_ || waiting_ == 0; }

  struct step_out {
    double loss = 0;
    std::vector<std::pair<uint32_t, net::message>> pushes;  ///< (shard, PushGradient); empty between pushes
  };
  /// Trains on one Batch message. Requires ready().
  step_out step(const net::message& batch);
  /// True when a push has been answered by every shard (or, with Hogwild!,
  /// applied): report() then describes the steps since the last report.
  bool report_due() const { return report_due_; }
  step_report report();

  uint32_t id() const { return c_.id; }

private:
  /// The payloads of shard s's next PushGradient, to be written in place: the
  /// last one's, once the shard has let it go, else a new message's.
  std::vector<float*> open_push(int s);
  /// Sends the pushes opened for this step (their headers set now).
  void push(step_out& out);
  void accumulate_staleness(uint64_t tau, bool rejected);

  std::shared_ptr<replica_pool> pool_;
  std::vector<tensor> w_;              // push_every > 1: this worker's parameters; else their shapes
  shape input_;
  shard_plan plan_;
  worker_config c_;
  kernels::context ctx_;               // c_.threads
  bool hogwild_ = false;
  std::vector<uint64_t> version_;      // per shard: version of the params held
  // push_every == 1: the latest Params of each shard, validated. A step's
  // replica reads its weights in place from them (w_ then only gives the
  // shapes) and writes its gradients in place into the pushes; it lets the
  // Params go when it pushes, so that the shard can update them in place.
  std::vector<net::message> latest_;
  std::vector<net::message> push_;     // per shard: the last PushGradient, reused in place
  std::vector<std::vector<shape>> shard_shapes_;  // per shard: its tensors' shapes
  int waiting_ = 0;                    // shards whose Params have not arrived
  int local_steps_ = 0;                // since the last push
  std::vector<std::vector<float>> start_;  // w at the last pull (push_every > 1)
  std::unique_ptr<model::optimizer> local_opt_;
  uint64_t steps_ = 0;
  tensor x_, dlogits_;  // the input batch and the loss gradient: small, kept per worker
  std::vector<int32_t> labels_;
  bool report_due_ = false;
  // Pending report.
  double loss_sum_ = 0;
  uint64_t samples_ = 0, loss_n_ = 0;
  uint64_t tau_sum_ = 0, tau_n_ = 0, tau_max_ = 0, rejected_ = 0;
};

/// One parameter shard: its tensors, the update rule and its per-worker
/// state, the version, staleness statistics and rejected-message counts.
class shard_core {
public:
  /// `ctx`: where the update rule and the replies' copies run (the constructor's
  /// first copy runs on the calling thread alone).
  shard_core(uint32_t id, std::vector<named_tensor> tensors, const model::update_config& rule,
             std::string lr_schedule, int64_t total_updates, net::reader_limits limits = {},
             const kernels::context& ctx = kernels::context{});

  /// Handles a PullParams or PushGradient from `sender_hint` (the worker id the
  /// transport knows, or -1). Returns the replies as (worker id, message).
  /// A message that is rejected is counted and answered, when its sender is
  /// known, with the current parameters flagged `rejected`, so the worker
  /// keeps training.
  std::vector<std::pair<uint32_t, net::message>> handle(const net::message& m, int64_t sender_hint = -1);

  uint32_t id() const { return id_; }
  uint64_t version() const { return version_; }
  const model::staleness_stats& staleness() const { return stats_; }
  const net::reject_counter& rejects() const { return rejects_; }
  const std::string& last_error() const { return last_error_; }
  /// The shard's tensors now (copies), e.g. for a checkpoint.
  std::vector<named_tensor> snapshot() const;
  /// Continues from a checkpoint: the version (the learning-rate schedule
  /// goes on from it) and the rule's state. Throws troupe::error if it does not fit.
  void restore(uint64_t version, const std::vector<named_tensor>& rule_state);

private:
  /// A new Params message: the parameters at `w`, version_, this header. Sets
  /// `*payload` to its flat payload (nullptr when its payloads are not adjacent).
  net::message build_params(const float* w, uint64_t tau, bool rejected, bool with_state,
                            float** payload = nullptr) const;
  /// Before an update: makes w_ this shard's alone. When w_ lies in current_'s
  /// payload and a worker still holds current_, the update goes to a copy.
  void own_parameters();
  /// current_ with this reply's header: set in place when nobody else holds it,
  /// shared as it is when its header already fits, else a new message.
  net::message reply(uint64_t tau, bool rejected);

  uint32_t id_;
  std::vector<std::string> names_;
  std::vector<shape> shapes_;
  int64_t n_ = 0;              // elements of all the shard's tensors
  // The parameters live in the payload of current_, the Params message that
  // answers the next request, and are updated there in place once the workers
  // have let it go (copy on write): a reply builds nothing and copies nothing.
  // Where the payloads cannot be adjacent (a tensor of an odd number of
  // elements) they live in flat_ and every new version builds a new message.
  net::message current_;
  uint64_t current_version_ = 0, current_tau_ = 0;  // current_'s header
  bool current_rejected_ = false;
  float* w_ = nullptr;         // the flat parameters: current_'s payload or flat_
  bool in_message_ = false;    // w_ lies in current_'s payload
  std::vector<float> flat_;
  std::vector<float> grad_;    // a pushed gradient whose payloads are not adjacent, concatenated
  model::update_config cfg_;
  kernels::context ctx_;
  std::unique_ptr<model::update_rule> rule_;
  std::string schedule_;
  int64_t total_updates_;
  net::reader_limits limits_;
  uint64_t version_ = 0;
  model::staleness_stats stats_;
  net::reject_counter rejects_;
  std::string last_error_;
  std::vector<std::pair<uint32_t, uint64_t>> waiting_;  // SSGD: (worker, staleness) until the round completes
};

/// Continues shard `shard` of `shards` from checkpoint `c` of an `algorithm`
/// run: its version and its rule's state (entries "shard<s>/<name>"). A
/// checkpoint of another algorithm or shard count, or a state that does not fit
/// (other --workers), leaves the shard fresh and says so in `log`.
void resume_shard(shard_core& shard, const net::checkpoint& c, const std::string& algorithm, int shards,
                  std::ostream& log);

} // namespace troupe::actors
