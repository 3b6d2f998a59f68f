#include "train/trace.hpp"

#include <fstream>
#include <nlohmann/json.hpp>

#include "tensor/error.hpp"

namespace troupe::train {

tracer::tracer(std::string path, uint32_t node) : path_(std::move(path)), node_(node) {}

void tracer::span(const std::string& track, const char* name, time_point begin, time_point end, int64_t micro_batch) {
  using us = std::chrono::microseconds;
  const int64_t b = std::chrono::duration_cast<us>(begin - start_).count();
  const int64_t d = std::chrono::duration_cast<us>(end - begin).count();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tracks_.find(track);
  if (it == tracks_.end()) it = tracks_.emplace(track, static_cast<int>(tracks_.size()) + 1).first;
  events_.push_back({it->second, name, b, d, micro_batch});
}

std::size_t tracer::spans() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

void tracer::write() const {
  nlohmann::json events = nlohmann::json::array();
  {
    std::lock_guard<std::mutex> lock(mu_);
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", node_}, {"args", {{"name", "node " + std::to_string(node_)}}}});
    for (const auto& [track, tid] : tracks_) {
      events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", node_}, {"tid", tid}, {"args", {{"name", track}}}});
      events.push_back({{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", node_}, {"tid", tid}, {"args", {{"sort_index", tid}}}});
    }
    for (const event& e : events_) {
      nlohmann::json j{{"name", e.name}, {"ph", "X"}, {"pid", node_}, {"tid", e.tid}, {"ts", e.begin_us}, {"dur", e.duration_us}};
      if (e.micro_batch >= 0) j["args"] = {{"micro_batch", e.micro_batch}};
      events.push_back(std::move(j));
    }
  }
  std::ofstream out(path_, std::ios::trunc);
  if (!out) throw error("--trace: cannot write " + path_);
  out << nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() << "\n";
  if (!out) throw error("--trace: writing " + path_ + " failed");
}

} // namespace troupe::train
