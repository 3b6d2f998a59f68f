#pragma once

// Pipeline schedules as pure generators of each stage's actions (like
// torch.distributed.pipelining's schedule tables): what a stage does next,
// in order, tested as tables without any actor.

#include <cstdint>
#include <string>
#include <vector>

namespace troupe::model {

enum class pipeline_schedule {
  gpipe,        ///< per mini-batch of M micro-batches: every forward, every backward, one update (a flush)
  one_f_one_b,  ///< PipeDream's 1F1B: warm-up forwards, then one forward and one backward in turn,
                ///< an update after every backward; each backward uses the weights its forward used
};
/// "gpipe", "1f1b".
const char* to_string(pipeline_schedule s);

struct pipeline_action {
  enum class kind : uint8_t { forward, backward, update };
  kind what = kind::forward;
  int64_t micro_batch = 0;  ///< over the run (micro-batch i belongs to mini-batch i / M); -1 for update
  bool operator==(const pipeline_action& o) const { return what == o.what && micro_batch == o.micro_batch; }
};
/// "F3", "B0", "U"
std::string to_string(const pipeline_action& a);

/// The actions of stage `stage` of `stages` over `total` micro-batches, in
/// groups of `micro_batches` (a mini-batch), produced one at a time.
class pipeline_program {
public:
  /// Throws troupe::error for a stage outside [0, stages), stages or
  /// micro_batches < 1, or flush points out of order or range.
  /// `flush_after` (1F1B; GPipe flushes after every mini-batch): counts of
  /// micro-batches from the program's start, increasing, in (0, total),
  /// after which the pipeline drains: every micro-batch before the point is
  /// backwarded and its update applied before the first one after it is
  /// forwarded, and each part between points is a 1F1B program of its own
  /// (warm-up, alternation, cool-down). A checkpoint taken at such a point
  /// holds everything the run has done, nothing in flight.
  pipeline_program(pipeline_schedule s, int stage, int stages, int micro_batches, int64_t total,
                   const std::vector<int64_t>& flush_after = {});
  bool done() const { return next_ >= length_; }
  /// The next action; requires !done().
  pipeline_action peek() const { return at(next_); }
  void advance() { ++next_; }
  /// The i-th action of the program.
  pipeline_action at(int64_t i) const;
  int64_t length() const { return length_; }
  /// The most micro-batches the stage holds at once (forwarded, not yet backwarded).
  int bound() const;

private:
  /// A part of a 1F1B program between flush points.
  struct part {
    int64_t first = 0, count = 0;  // its micro-batches
    int64_t warmup = 0;            // its warm-up forwards
    int64_t begin = 0;             // its first action's index in the program
  };
  /// The j-th action of part `p`.
  pipeline_action at(const part& p, int64_t j) const;

  pipeline_schedule s_;
  int stage_, stages_, m_;
  int64_t total_, length_ = 0, next_ = 0;
  std::vector<part> parts_;  // 1F1B
};

/// Every action of a program (for tests and small runs).
std::vector<pipeline_action> actions(const pipeline_program& p);

} // namespace troupe::model
