#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "actors/param_client.hpp"
#include "actors/param_holder.hpp"
#include "kernels/context.hpp"
#include "model/optimizer.hpp"
#include "model/update_rule.hpp"
#include "net/checkpoint.hpp"
#include "train/initial_state.hpp"
#include "net/message.hpp"
#include "train/plan.hpp"
#include "train/trace.hpp"

namespace troupe::actors {

/// One parameter shard: its range of the parameter layout, the update rule
/// with its per-worker state, the version, staleness statistics and counts of
/// rejected messages. Takes PullParams and PushGradient messages and returns
/// the replies; replies go to the source address of the message they answer.
class shard_core {
public:
  struct reply {
    net::address to;
    net::message msg;
  };

  /// `tensors`: the shard's tensors (names, shapes, initial values), which
  /// must be p.range of the layout.
  shard_core(const train::shard_plan& p, const std::vector<named_tensor>& tensors, const model::update_config& rule,
             model::lr_schedule schedule, int64_t total_updates, const kernels::context& ctx,
             net::reader_limits limits = net::peer_limits());

  /// Handles one message. A message that is rejected (malformed, NaN/Inf,
  /// wrong range, base version ahead, ...) is counted and, when its source is
  /// a known worker, answered with the current parameters flagged `rejected`,
  /// so that the worker keeps training; a message whose source cannot be
  /// read is only counted. Each message is opened and validated once. A
  /// Control STOP is answered by nothing; stop_requested() is true from then on.
  std::vector<reply> handle(const net::message& m);
  bool stop_requested() const { return stop_; }
  /// The run's timeline: a span "apply" per push.
  void trace(std::shared_ptr<train::tracer> t) {
    trace_ = std::move(t);
    track_ = net::to_string(p_.address);
  }

  const net::address& address() const { return p_.address; }
  uint32_t id() const { return p_.address.index; }
  uint64_t version() const { return holder_->version(); }
  const model::staleness_stats& staleness() const { return stats_; }
  const net::reject_counter& rejects() const { return rejects_; }
  const std::string& last_error() const { return last_error_; }
  /// The shard's tensors now (copies).
  std::vector<named_tensor> snapshot() const;
  /// The update rule's state now (copies, sorted by name).
  std::vector<named_tensor> rule_state() const;
  /// Continues from a checkpoint: the version (the learning-rate schedule
  /// goes on from it) and the rule's state. Throws troupe::error if it does not fit.
  void restore(uint64_t version, const std::vector<named_tensor>& rule_state);

private:
  std::vector<reply> on_pull(const net::envelope_reader& r, const net::address& from);
  reply answer_pull(const net::address& to, bool with_state);
  /// The kept pulls that the pushes so far answer.
  void answer_due_pulls(std::vector<reply>& out);
  std::vector<reply> on_push(const net::envelope_reader& r, const net::address& from);
  /// The rule's worker index of a pushing or pulling address; -1 for one that is not a worker of this shard.
  int worker_of(const net::address& from) const;
  /// worker_of(), or throws net::message_error naming `what`.
  uint32_t worker_index(const net::address& from, const char* what) const;

  train::shard_plan p_;
  std::shared_ptr<train::tracer> trace_;
  std::string track_;
  std::vector<std::string> names_;
  int64_t n_ = 0;
  // The parameters, in the Params message that answers the next request
  // (copy on write), and the pulls that wait for pushes.
  std::unique_ptr<param_holder> holder_;
  model::update_config cfg_;
  std::unique_ptr<model::update_rule> rule_;
  model::lr_schedule schedule_;
  int64_t total_updates_;
  kernels::context ctx_;
  net::reader_limits limits_;
  model::staleness_stats stats_;
  net::reject_counter rejects_;
  std::string last_error_;
  std::vector<std::pair<net::address, uint64_t>> waiting_;  // SSGD: (worker, staleness) until the round completes
  uint64_t pushes_ = 0;  // pushes applied (SSGD: taken into a round), those before a resumed run's start included
  bool stop_ = false;
  /// A message that could not be opened: counted, and answered when its header names a worker.
  std::vector<reply> rejected(const net::message& m, const net::message_error& e);
  /// Counts a rejection of `from`'s message and answers a worker with the current parameters, flagged.
  std::vector<reply> answer_rejected(const net::address& from, net::reject_reason why, const std::string& what,
                                     bool push);
};

/// Continues `shard` from `h` (train::resumed_start's entry for it): its
/// version and its rule's state, said on `log` with the state's digest. A
/// holder that starts fresh (another algorithm or shard count), or a state
/// that does not fit (other --workers), leaves the shard fresh and says why.
void resume_shard(shard_core& shard, const train::holder_start& h, std::ostream& log);

} // namespace troupe::actors
