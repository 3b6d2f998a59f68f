#pragma once

// A run's timeline in the Chrome trace event format (JSON), which Perfetto
// (ui.perfetto.dev) and chrome://tracing open: one track per actor, a span for
// each forward, backward, update, push, apply, load and wait, with micro-batch
// ids. bench/trace_stats.py computes utilization and pipeline bubbles from it.

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace troupe::train {

class tracer {
public:
  using time_point = std::chrono::steady_clock::time_point;
  /// Spans of this process (`node`: the trace's process id) go to `path` at write().
  tracer(std::string path, uint32_t node);

  /// A span `name` on track `track` (an actor, e.g. "stage 1"), with the
  /// micro-batch it worked on (-1: none). Thread-safe.
  void span(const std::string& track, const char* name, time_point begin, time_point end, int64_t micro_batch = -1);
  /// Writes every span (a JSON object with "traceEvents"); throws troupe::error
  /// naming the file when it cannot be written.
  void write() const;
  std::size_t spans() const;

private:
  struct event {
    int tid;
    const char* name;
    int64_t begin_us, duration_us, micro_batch;
  };
  std::string path_;
  uint32_t node_;
  time_point start_ = std::chrono::steady_clock::now();
  mutable std::mutex mu_;
  std::map<std::string, int> tracks_;
  std::vector<event> events_;
};

/// Records a span from its construction to its destruction (nothing when `t` is null).
class trace_span {
public:
  trace_span(tracer* t, const std::string& track, const char* name, int64_t micro_batch = -1)
      : t_(t), track_(t ? &track : nullptr), name_(name), mb_(micro_batch), begin_(std::chrono::steady_clock::now()) {}
  ~trace_span() {
    if (t_) t_->span(*track_, name_, begin_, std::chrono::steady_clock::now(), mb_);
  }
  /// `track` is kept by reference: a temporary would be gone by the end.
  trace_span(tracer* t, std::string&& track, const char* name, int64_t micro_batch = -1) = delete;
  trace_span(const trace_span&) = delete;
  trace_span& operator=(const trace_span&) = delete;

private:
  tracer* t_;
  const std::string* track_;
  const char* name_;
  int64_t mb_;
  tracer::time_point begin_;
};

} // namespace troupe::train
