#include "net/session.hpp"

#include <algorithm>
#include <iterator>
#include <utility>

namespace troupe::net {

std::string admission::what() const {
  if (accepted) return {};
  return "the queue for this peer holds " + std::to_string(held) + " bytes queued or not acknowledged; " +
         std::to_string(bytes) + " more would exceed max_queue_bytes (" + std::to_string(limit) + ")";
}

session::session(session_counters& counters, uint64_t max_queue_bytes, std::function<uint64_t()> new_id)
    : counters_(counters), max_queue_bytes_(max_queue_bytes), new_id_(std::move(new_id)) {
  my_sid_ = new_id_();
}

// ---- the session ----

session_info session::offer(uint64_t incarnation) const { return {incarnation, my_sid_, peer_sid_, delivered_}; }

bool session::offered(const session_info& sent) const {
  return sent.session == my_sid_ && sent.peer_session == peer_sid_;
}

// The peer remembers this side's session and offers the one this side remembers, from the same incarnation.
bool session::resumable(const session_info& their) const {
  return their.peer_session != 0 && their.peer_session == my_sid_ && peer_sid_ != 0 && their.session == peer_sid_ &&
         their.incarnation == peer_incarnation_;
}

session::outcome session::take(const session_info& their) {
  if (resumable(their)) {
    resume(their.delivered);
    return outcome::resumed;
  }
  outcome o = outcome::renewed;
  if (up_) {
    o = their.incarnation != peer_incarnation_ ? outcome::restarted : outcome::abandoned;
    close(false);
  }
  peer_sid_ = their.session;
  peer_incarnation_ = their.incarnation;
  set_delivered(0);
  acked_ = 0;
  return o;
}

// What the peer delivered is released; the rest goes again, in order, ahead of what was never written.
void session::resume(uint64_t their_delivered) {
  acknowledge(their_delivered);
  counters_.resent += unacked_.size();
  while (!unacked_.empty()) {
    queue_.push_front(std::move(unacked_.back()));
    unacked_.pop_back();
  }
}

bool session::open() {
  if (up_) return false;
  up_ = true;
  ++counters_.up;
  return true;
}

std::size_t session::close(bool renew_ids) {
  const std::size_t dropped = queue_.size() + unacked_.size();
  queue_.clear();
  unacked_.clear();
  queued_bytes_ = 0;
  next_seq_ = 1;
  counters_.dropped_at_down += dropped;
  set_delivered(0);
  acked_ = ack_frames_ = ack_bytes_ = 0;
  if (renew_ids) {
    my_sid_ = new_id_();
    peer_sid_ = 0;
    peer_incarnation_ = 0;
  }
  if (up_) {
    up_ = false;
    --counters_.up;
  }
  return dropped;
}

// ---- sending ----

admission session::admit(uint64_t bytes) {
  if (queued_bytes_ + bytes > max_queue_bytes_) return {false, queued_bytes_, bytes, max_queue_bytes_};
  queued_bytes_ += bytes;
  return {};
}

void session::enqueue(session_frame q) {
  auto at = queue_.end();
  while (at != queue_.begin() && !std::prev(at)->numbered && std::prev(at)->priority > q.priority) --at;
  queue_.insert(at, std::move(q));
}

session_frame session::pop_front() {
  session_frame q = std::move(queue_.front());
  queue_.pop_front();
  number(q);  // numbered in the order written, whatever overtook what
  return q;
}

void session::number(session_frame& q) {
  if (q.numbered) return;
  q.f.set_sequence(next_seq_++);
  q.numbered = true;
}

void session::written(session_frame q) {
  if (q.f.sequence <= acked_)
    queued_bytes_ -= std::min<uint64_t>(q.f.plain_bytes(), queued_bytes_);
  else
    unacked_.push_back(std::move(q));
}

void session::interrupted(session_frame q) { unacked_.push_back(std::move(q)); }

void session::acknowledge(uint64_t seq) {
  if (seq <= acked_) return;
  acked_ = seq;
  uint64_t bytes = 0;
  while (!unacked_.empty() && unacked_.front().f.sequence <= seq) {
    bytes += unacked_.front().f.plain_bytes();
    unacked_.pop_front();
  }
  queued_bytes_ -= std::min(bytes, queued_bytes_);
}

// ---- receiving ----

bool session::duplicate(uint64_t seq) {
  if (seq > delivered_) return false;
  ++counters_.duplicates_dropped;
  return true;
}

void session::deliver(uint64_t seq, uint64_t bytes) {
  if (seq > delivered_ + 1) counters_.lost += seq - delivered_ - 1;
  set_delivered(seq);
  ++ack_frames_;
  ack_bytes_ += bytes;
}

void session::skip(uint64_t seq) { set_delivered(seq); }

void session::set_delivered(uint64_t seq) {
  delivered_ = seq;
  delivered_shared_.store(seq, std::memory_order_relaxed);
}

} // namespace troupe::net
