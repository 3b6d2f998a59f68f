#pragma once

#include <memory>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "actors/param_client.hpp"
#include "actors/worker_core.hpp"
#include "kernels/context.hpp"
#include "model/model.hpp"
#include "train/loop.hpp"
#include "train/plan.hpp"

namespace troupe::actors {

/// The evaluator: takes a snapshot of the parameters (a Params from every
/// shard, or a copy of the Hogwild! buffer), evaluates it on the test set and
/// writes the checkpoint, while the workers go on training. Its actor runs on
/// a thread of its own, so that an evaluation never holds up a scheduler thread.
class evaluator_core {
public:
  struct config {
    net::address self;
    std::vector<train::shard_plan> shards;    ///< empty with Hogwild!
    std::shared_ptr<hogwild_store> hogwild;   ///< Hogwild! only
    std::shared_ptr<const train::loaded_data> data;
    int64_t batch_size = 64;
    int64_t sample_tokens = 0;  ///< a language model's sample after each evaluation (settings::sample_tokens)
    std::string checkpoint;                   ///< empty: never written
    std::string algorithm;                    ///< recorded in the checkpoint
  };
  /// `net` is the built model (its parameters are overwritten by each snapshot).
  evaluator_core(config c, model::model net);

  /// Starts a snapshot; returns the pulls to send (none with Hogwild!, whose
  /// snapshot is taken at once: complete() is then true).
  std::vector<outgoing> begin(const snapshot_request& r);
  /// A shard's Params for the snapshot in progress; false (ignored) for a
  /// shard that already answered or when no snapshot is in progress (a late
  /// answer to a pull asked again). Throws net::message_error for one that
  /// does not fit.
  bool on_params(const net::envelope_reader& r);
  bool on_params(const net::message& m);  ///< opens `m` (peer limits), then as above
  /// True when every shard has answered the snapshot in progress.
  bool complete() const { return active_ && client_.ready(); }
  /// Evaluates the completed snapshot and, when asked, writes it as the checkpoint.
  evaluation_result finish();
  bool active() const { return active_; }
  const net::address& address() const { return c_.self; }
  const snapshot_request& request() const { return req_; }
  /// The shards that have not answered the snapshot in progress (for a timeout's message).
  std::string missing() const { return client_.missing(); }
  /// Pulls again for the shards that have not answered (a pull or its reply lost on the way).
  std::vector<outgoing> retry() const { return active_ ? client_.missing_pulls() : std::vector<outgoing>{}; }

private:
  /// Writes the snapshot (parameters, each shard's version and rule state)
  /// as the job's checkpoint, atomically.
  void write_checkpoint();

  /// Training batches run to estimate batch norm's statistics for a snapshot.
  static constexpr int64_t batch_norm_batches = 50;

  config c_;
  model::model net_;
  model::model::flat_buffers flat_;
  kernels::context ctx_ = kernels::context::with_threads(1);
  snapshot_request req_;
  param_client client_;
  bool active_ = false;
  std::vector<named_tensor> rule_state_;  // "shard<s>/<name>"
  std::vector<uint64_t> versions_;
};

} // namespace troupe::actors
