#include "model/schedule.hpp"

#include <algorithm>

#include "tensor/error.hpp"

namespace troupe::model {

const char* to_string(pipeline_schedule s) { return s == pipeline_schedule::gpipe ? "gpipe" : "1f1b"; }

std::string to_string(const pipeline_action& a) {
  switch (a.what) {
    case pipeline_action::kind::forward: return "F" + std::to_string(a.micro_batch);
    case pipeline_action::kind::backward: return "B" + std::to_string(a.micro_batch);
    case pipeline_action::kind::update: return "U";
  }
  return "?";
}

pipeline_program::pipeline_program(pipeline_schedule s, int stage, int stages, int micro_batches, int64_t total,
                                   const std::vector<int64_t>& flush_after)
    : s_(s), stage_(stage), stages_(stages), m_(micro_batches), total_(total) {
  if (stages < 1 || stage < 0 || stage >= stages)
    throw error("pipeline: stage " + std::to_string(stage) + " of " + std::to_string(stages));
  if (micro_batches < 1) throw error("--micro-batches must be at least 1, got " + std::to_string(micro_batches));
  if (total < 0) throw error("pipeline: a negative number of micro-batches");
  if (s_ == pipeline_schedule::gpipe) {
    // Whole mini-batches: 2M actions and an update each.
    length_ = (total_ / m_) * (2 * m_ + 1);
    return;
  }
  int64_t from = 0;
  std::vector<int64_t> ends = flush_after;
  ends.push_back(total_);
  for (int64_t end : ends) {
    if (end <= from || end > total_)
      throw error("pipeline: flush point " + std::to_string(end) + " after " + std::to_string(from) + " of " +
                  std::to_string(total_) + " micro-batches");
    part p;
    p.first = from;
    p.count = end - from;
    p.warmup = std::min<int64_t>(stages_ - 1 - stage_, p.count);
    p.begin = length_;
    // Warm-up forwards; then per remaining forward: F, B, U; then the last backwards: B, U.
    length_ += p.warmup + 3 * (p.count - p.warmup) + 2 * p.warmup;
    parts_.push_back(p);
    from = end;
  }
}

pipeline_action pipeline_program::at(int64_t i) const {
  using k = pipeline_action::kind;
  if (i < 0 || i >= length_) throw error("pipeline: action " + std::to_string(i) + " past the program's end");
  if (s_ == pipeline_schedule::gpipe) {
    const int64_t round = i / (2 * m_ + 1), p = i % (2 * m_ + 1), base = round * m_;
    if (p < m_) return {k::forward, base + p};
    if (p < 2 * m_) return {k::backward, base + (2 * m_ - 1 - p)};  // the last micro-batch first
    return {k::update, -1};
  }
  // The part holding action i: the last that begins at or before it.
  auto it = std::upper_bound(parts_.begin(), parts_.end(), i, [](int64_t v, const part& p) { return v < p.begin; });
  return at(*std::prev(it), i - std::prev(it)->begin);
}

pipeline_action pipeline_program::at(const part& p, int64_t j) const {
  using k = pipeline_action::kind;
  if (j < p.warmup) return {k::forward, p.first + j};
  const int64_t steady = p.count - p.warmup;  // forwards after the warm-up
  j -= p.warmup;
  if (j < 3 * steady) {
    const int64_t n = j / 3;
    switch (j % 3) {
      case 0: return {k::forward, p.first + p.warmup + n};
      case 1: return {k::backward, p.first + n};
      default: return {k::update, -1};
    }
  }
  const int64_t c = j - 3 * steady;  // cool-down: B, U for the warm-up's micro-batches
  return c % 2 == 0 ? pipeline_action{k::backward, p.first + steady + c / 2} : pipeline_action{k::update, -1};
}

int pipeline_program::bound() const {
  return s_ == pipeline_schedule::gpipe ? m_ : static_cast<int>(stages_ - stage_);
}

std::vector<pipeline_action> actions(const pipeline_program& p) {
  std::vector<pipeline_action> out;
  for (int64_t i = 0; i < p.length(); ++i) out.push_back(p.at(i));
  return out;
}

} // namespace troupe::model
