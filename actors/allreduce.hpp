#pragma once

// Synchronous data parallelism without parameter shards: each worker keeps
// its own replica, allreduces its gradients with the other workers (the
// collective core, in buckets that go out as backward fills them) and applies
// the same optimizer step to the mean, so that every replica holds the same
// bits after every step. The first worker also answers the evaluator's pulls
// with its replica (a snapshot, a checkpoint with its optimizer's state).

#include <cstdint>
#include <memory>
#include <vector>

#include "actors/collective_core.hpp"
#include "actors/worker_core.hpp"
#include "model/flat_optimizer.hpp"
#include "model/layout.hpp"
#include "model/schedule.hpp"

namespace troupe::actors {

struct allreduce_config {
  std::vector<net::address> members;  ///< the workers, by member id (their plan order)
  int32_t member = 0;                 ///< this worker's id
  model::param_layout layout;
  std::vector<float> initial;         ///< the starting parameters (the same on every member)
  std::vector<float> state;           ///< a resumed run's optimizer state (model::flat_optimizer; empty: zeros)
  uint64_t steps_before = 0;          ///< global steps applied before (a resumed run)
  uint64_t reports_before = 0;        ///< the coordinator's count of step reports before (a resumed run)
  /// Each replica's optimizer on the mean gradient (total_steps: global steps).
  model::flat_optimizer_options opt;
  int64_t bucket_elements = 0;        ///< a bucket's least size (0: one bucket)
  collective_options options;
  bool holder = false;                ///< answers PullParams (the plan's worker holder)
  /// Where snapshots will be taken, in the coordinator's count of reports:
  /// the holder keeps its replica there (and at each epoch's end), in case the
  /// pull comes once it has gone on. 0: none.
  uint64_t last_report = 0;           ///< --max-steps
  uint64_t snapshot_every = 0;        ///< checkpoint-every-steps
  /// The group may re-form (a cluster: a worker's node may be lost): each step
  /// keeps what a rollback needs (the parameters and optimizer state before it, the
  /// worker's own gradient). False in one process, where nothing is lost.
  bool elastic = true;
};

/// The weight source of a worker of an allreduce. Throws troupe::error for a
/// config that does not fit (a member id outside the group, sizes).
std::unique_ptr<weight_source> allreduce_weights(const allreduce_config& c);

/// A Regroup message (net/messages.capnp): an allreduce's group re-formed.
struct regroup {
  enum phase_t : uint8_t { hold = 0, report = 1, go = 2 };
  uint64_t epoch = 0;
  uint8_t phase = hold;
  uint64_t step = 0;
  std::vector<uint32_t> members, joiners;
  uint32_t root = 0;
  uint64_t reports = 0;  ///< go: the coordinator's count of step reports (the holder's pulls count from it)
};
net::message make_regroup(const net::address& from, const net::address& to, const regroup& g);
/// Throws net::message_error for another kind.
regroup read_regroup(const net::envelope_reader& r);

/// Gives the piece `in` to `group` and appends its answers (from `self` to
/// `members`, by member id) to `out`. Throws net::message_error (malformed),
/// its text `who` and the group's last error, when the group rejected the
/// piece for more than a duplicate or a piece of an operation already over (a
/// frame delivered twice): a piece that cannot be part of the operation,
/// which then cannot end.
void accept_piece(collective_core& group, const collective_message& in, const net::address& self,
                  const std::vector<net::address>& members, std::vector<outgoing>& out, const std::string& who);

/// The wire form of a collective message from `from` (a member's address) to `to`.
net::message to_wire(const collective_message& m, const net::address& from, const net::address& to);
/// Each of `msgs` as an envelope from `from` to its receiver, `members[receiver]`, appended to `out`.
void send_collective(const std::vector<collective_message>& msgs, const net::address& from,
                     const std::vector<net::address>& members, std::vector<outgoing>& out);
/// A Collective message read back, its payload copied; throws net::message_error for another kind.
collective_message from_wire(const net::envelope_reader& r);
/// The same, a float32 payload viewed in `r`'s frame (collective_message::view):
/// valid while the frame is; own() it to keep it longer.
collective_message view_from_wire(const net::envelope_reader& r);

} // namespace troupe::actors
