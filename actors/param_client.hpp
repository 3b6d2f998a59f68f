#pragma once

// The client side of the parameter conversation, one class for every role
// that pulls parameters from holders and pushes gradients to them: a
// data-parallel worker (its shards), a hybrid's pipeline stage (its stage's
// shard) and the evaluator (every holder, for a snapshot). The holder side is
// shard_core (and, for the parameters it owns, stage_core).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/model.hpp"
#include "net/message.hpp"
#include "train/epoch_accumulator.hpp"
#include "train/plan.hpp"

namespace troupe::actors {

/// A message to send and its destination. Across nodes, a lower `priority`
/// overtakes what waits to be written to the same node (net::transport::send).
struct outgoing {
  net::address to;
  net::message msg;
  int priority = 0;
};

/// Staleness and rejections of the updates since the last report.
struct staleness_tally {
  uint64_t sum = 0, count = 0, max = 0, rejected = 0;
  void add(uint64_t tau, bool was_rejected);
  /// Writes the mean, max (capped to 32 bits) and rejections into `r` (0 for no updates).
  void fill(train::step_report& r) const;
};

/// The pulls a holder keeps until it has applied the updates they count
/// (PullParams.steps: a snapshot's pull waits for the mini-batches reported).
template <class Pull>
class kept_pulls {
public:
  void keep(uint64_t steps, Pull p) { kept_.push_back({steps, std::move(p)}); }
  /// Calls answer(pull) for every pull that `applied` updates answer, and forgets it.
  template <class F>
  void answer_due(uint64_t applied, F&& answer) {
    for (auto it = kept_.begin(); it != kept_.end();) {
      if (it->first > applied) {
        ++it;
        continue;
      }
      answer(it->second);
      it = kept_.erase(it);
    }
  }

private:
  std::vector<std::pair<uint64_t, Pull>> kept_;
};

/// Pulls, Params replies (validated against each holder's range of the
/// layout) and pushes (built once, then rewritten in place once the holder
/// has let them go), with the answers awaited and the staleness of the
/// answered pushes. Holders are known by their Params' shard field: their
/// address's index.
class param_client {
public:
  /// `layout`: the whole model's; each holder's range is a part of it.
  param_client(net::address self, std::vector<train::shard_plan> holders, const model::param_layout& layout);

  /// A PullParams to every holder, each of whose answer is then awaited.
  /// `with_state`: with the holder's optimizer state (a checkpoint's);
  /// `steps`: a snapshot's count of the updates it must hold.
  std::vector<outgoing> pull_all(bool with_state = false, uint64_t steps = 0);
  /// The same pulls again, for the holders whose answer has not come (a push,
  /// a pull or a reply lost on the way).
  std::vector<outgoing> missing_pulls() const;

  struct accepted {
    std::size_t holder;   ///< its index in holders()
    const float* values;  ///< the holder's range, valid while the message lives
    uint64_t version;
    bool first;           ///< the first answer to the last push or pull (a second one is a re-pull's)
    bool round_done;      ///< a push's last awaited answer: every holder has answered it
  };
  /// Validates a Params: from a holder, its range. Records the version held
  /// (unless (*keep_version)[holder]: a step computes on the version it has)
  /// and, for the first answer to a push, its staleness in `tally` (when
  /// given). Throws net::message_error.
  accepted accept(const net::envelope_reader& r, staleness_tally* tally = nullptr,
                  const std::vector<bool>* keep_version = nullptr);

  /// From now on, an answer to a push that is not past the version pushed
  /// from (and not a rejection) is a late duplicate of the answer before
  /// (a frame delivered twice), and accept() reports it as not `first`. Only
  /// for a client that never pulls again during a push (a hybrid's stage): a
  /// re-pull's answer may hold the version pushed from.
  void ignore_stale_answers() { ignore_stale_ = true; }
  /// Every holder has answered the last push or pull.
  bool ready() const { return waiting_ == 0; }
  bool answered(std::size_t h) const { return answered_[h]; }
  /// The holders whose answer is awaited, by address ("" when none).
  std::string missing() const;
  std::size_t size() const { return holders_.size(); }
  const train::shard_plan& holder(std::size_t h) const { return holders_[h]; }
  const std::vector<train::shard_plan>& holders() const { return holders_; }
  const model::param_layout& layout() const { return layout_; }
  /// The version of holder h's parameters held.
  uint64_t version(std::size_t h) const { return version_[h]; }

  /// The payload of holder h's next PushGradient, to be written in place.
  float* open_push(std::size_t h);
  /// Sends holder h's push opened for this step (its header set now) and awaits its answer.
  void push_one(std::size_t h, uint64_t step, std::vector<outgoing>& out);
  bool sent(std::size_t h) const { return sent_[h]; }
  /// Sends the pushes of this step that push_one has not sent; the next step starts afresh.
  void push(uint64_t step, std::vector<outgoing>& out);

private:
  std::size_t index_of(uint32_t shard) const;

  net::address self_;
  std::vector<train::shard_plan> holders_;
  model::param_layout layout_;
  std::vector<std::vector<shape>> shapes_;  // per holder: its tensors' shapes
  std::vector<uint64_t> version_;           // per holder: version of the parameters held
  std::vector<net::message> push_;          // per holder: the last PushGradient, reused in place
  std::vector<bool> answered_;              // per holder: its answer to the last push or pull came
  std::vector<bool> sent_;                  // per holder: pushed in this step
  int waiting_ = 0;                         // holders whose answer has not come
  bool pushed_ = false;                     // the answers awaited are a push's (not a pull's)
  bool ignore_stale_ = false;
  bool with_state_ = false;                 // the last pull_all's, asked again by missing_pulls
  uint64_t steps_ = 0;
};

} // namespace troupe::actors
