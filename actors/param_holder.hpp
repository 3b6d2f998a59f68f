#pragma once

// The holder side of the parameter conversation, one class for the roles
// that hold parameters others pull: a parameter shard (shard_core) and a
// pipeline stage (stage_core). The client side is param_client.

#include <cstdint>
#include <utility>
#include <vector>

#include "actors/param_client.hpp"
#include "kernels/context.hpp"
#include "model/layout.hpp"
#include "net/message.hpp"
#include "tensor/tensor.hpp"

namespace troupe::actors {

/// A versioned flat range of the parameter layout, kept in the payload of the
/// Params message that answers the next pull, so that a reply builds nothing
/// and copies nothing. Copy on write: while anyone else holds that message (a
/// peer it was sent to, a micro-batch in flight that computes on this
/// version), an update goes to a copy, so that a message someone holds never
/// changes. Also keeps the pulls that wait for updates not applied yet.
class param_holder {
public:
  /// `shard`: the Params' shard field (the holder's address index); `range`:
  /// its part of the layout, `shapes` its tensors' shapes; `initial`: its
  /// range's values. The first message is built on one thread (the caller's,
  /// a node's main thread, which runs no kernels); copies later use `ctx`.
  param_holder(net::address self, uint32_t shard, const model::shard_range& range, std::vector<shape> shapes,
               const float* initial, const kernels::context& ctx);

  int64_t size() const { return range_.numel(); }
  const std::vector<shape>& shapes() const { return shapes_; }
  /// Updates applied (a shard: its version; a stage: weight versions).
  uint64_t version() const { return version_; }
  void set_version(uint64_t v) { version_ = v; }
  /// The values now, read-only.
  const float* values() const { return w_; }

  /// A version kept alive while something computes on it: its message is held,
  /// so that the next update goes to a copy.
  struct held {
    net::message msg;
    const float* values = nullptr;
    uint64_t version = 0;
  };
  held hold() const { return {current_, w_, version_}; }

  /// The values, this holder's alone (copied first when someone else holds
  /// them), to update in place; then bump().
  float* writable();
  /// An update is applied: the next version.
  void bump() { ++version_; }
  /// writable(), `n = size()` values copied in, and bump().
  void assign(const float* values);

  /// The Params for `to` with this header: the held message itself, its header
  /// set in place when nobody else holds it, shared as it is when its header
  /// fits, else a copy. A shared message keeps the destination of its first
  /// recipient: routing uses the address a reply is sent to, not the envelope's.
  net::message reply(const net::address& to, uint64_t tau = 0, bool rejected = false);
  /// A new Params for `to` that also carries `state` (a checkpoint's optimizer state).
  net::message reply_with_state(const net::address& to, const std::vector<named_tensor>& state) const;

  /// A pull that waits for updates (PullParams.steps) not applied yet.
  struct pull {
    net::address from;
    bool with_state = false;
  };
  void keep(uint64_t steps, pull p) { pulls_.keep(steps, p); }
  /// Calls answer(pull) for every kept pull that `applied` updates answer, and forgets it.
  template <class F>
  void answer_due(uint64_t applied, F&& answer) {
    pulls_.answer_due(applied, std::forward<F>(answer));
  }

private:
  net::message build(const net::address& to, const float* w, uint64_t tau, bool rejected,
                     const std::vector<named_tensor>* state, float** payload) const;

  net::address self_;
  uint32_t shard_;
  model::shard_range range_;
  std::vector<shape> shapes_;
  kernels::context ctx_;
  net::message current_;  // the Params whose payload holds the values
  float* w_ = nullptr;    // current_'s payload
  uint64_t version_ = 0;
  uint64_t current_version_ = 0, current_tau_ = 0;  // current_'s header
  bool current_rejected_ = false;
  kept_pulls<pull> pulls_;
};

} // namespace troupe::actors
