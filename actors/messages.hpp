#pragma once

// Builders and readers of the messages the roles exchange (net/messages.capnp;
// docs/protocol.md says who sends which to whom). Every message starts with
// the schema version and its source and destination addresses.

#include <cstdint>
#include <string>

#include "kernels/context.hpp"
#include "model/layout.hpp"
#include "net/message.hpp"
#include "train/epoch_accumulator.hpp"

namespace troupe::actors {

/// `l` whose NaN/Inf scan of tensor payloads runs on the receiver's kernel
/// threads (kernels::all_finite with `ctx`, which must outlive the limits).
net::reader_limits with_scan(net::reader_limits l, const kernels::context& ctx);
/// net::peer_limits() with the receiver's scan.
inline net::reader_limits receiver_limits(const kernels::context& ctx) { return with_scan(net::peer_limits(), ctx); }

/// A request for shard `shard`'s parameters; `with_state`: the reply carries
/// the update rule's state too (for a checkpoint).
/// `steps`: a pipeline stage answers once it has applied this many mini-batches' updates.
net::message make_pull(const net::address& from, const net::address& shard, bool with_state = false,
                       uint64_t steps = 0);
net::message make_control(const net::address& from, const net::address& to, wire::Control::Kind kind,
                          uint32_t amount = 0, const std::string& detail = {});
/// The payload of a PushGradient of `range` (tensors of `shapes`) from `from`
/// to `shard`, to be written in place: `push` itself when nobody else holds
/// it any more (its header stays; set the base version and step), else a new
/// message put in `push`.
float* open_push(net::message& push, const net::address& from, const net::address& shard,
                 const model::shard_range& range, const std::vector<shape>& shapes);
/// What a holder of parameters (a stage, an allreduce's worker) answers a
/// pull with: its range of the layout (`first` tensor, element `offset`,
/// `shapes`, the values) at `version`, and its optimizer's `state` when
/// given (a checkpoint's pull; empty or null: none).
struct held_params {
  uint32_t shard = 0;
  uint64_t version = 0;
  uint32_t first = 0;
  int64_t offset = 0;
  const std::vector<shape>* shapes = nullptr;
  const float* values = nullptr;
  const std::vector<named_tensor>* state = nullptr;
};
net::message make_params(const net::address& from, const net::address& to, const held_params& h);

/// A worker's report to the coordinator.
net::message make_metrics(const net::address& from, const net::address& to, const train::step_report& r);
/// Throws net::message_error for a report with non-finite numbers or from a non-worker.
train::step_report read_metrics(const net::envelope_reader& r);

/// What a Snapshot asks the evaluator to do.
struct snapshot_request {
  uint32_t epoch = 0;        ///< 1-based epoch this snapshot closes
  uint32_t epochs_done = 0;  ///< the checkpoint's completed epochs
  uint64_t steps = 0;
  bool evaluate = true, checkpoint = false;
  bool periodic = false;     ///< a checkpoint between epochs, not an epoch's record
  /// Samples of epoch epochs_done + 1 trained so far: a run resumed from the
  /// checkpoint trains the rest of that epoch.
  uint64_t epoch_samples = 0;
};
net::message make_snapshot(const net::address& from, const net::address& to, const snapshot_request& s);
snapshot_request read_snapshot(const net::envelope_reader& r);

/// What the evaluator found.
struct evaluation_result {
  uint32_t epoch = 0;
  double test_accuracy = -1;  ///< -1 when not evaluated
  bool checkpointed = false;
  bool periodic = false;      ///< answers a periodic snapshot
  double validation_accuracy = -1;  ///< -1 without a validation set
  double test_loss = -1, validation_loss = -1;  ///< a language model's, per token; -1 otherwise
  std::string sample;                           ///< a language model's text (--sample-tokens); empty: none
};
net::message make_evaluation(const net::address& from, const net::address& to, const evaluation_result& e);
evaluation_result read_evaluation(const net::envelope_reader& r);

} // namespace troupe::actors
