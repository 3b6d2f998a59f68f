#include "train/epoch_accumulator.hpp"

#include <algorithm>
#include <cmath>

namespace troupe::train {

epoch_accumulator::epoch_accumulator(const limits& l, time_point start)
    : l_(l), epoch_start_(start), epoch_(l.first_epoch), steps_(l.first_steps),
      samples_(static_cast<uint64_t>(std::max<int64_t>(0, l.first_epoch_samples))), resumed_samples_(samples_),
      worker_samples_(static_cast<std::size_t>(std::max(1, l.workers)), 0), worker_tau_(worker_samples_.size()) {}

epoch_accumulator::verdict epoch_accumulator::add(const step_report& r) {
  if (done_) return verdict::end_run;
  ++steps_;
  ++reports_;
  samples_ += r.samples;
  loss_ += r.loss;
  if (r.worker < worker_samples_.size()) {
    worker_samples_[r.worker] += r.samples;
    worker_tau_[r.worker].compute_s += r.compute_s;
  }
  tally_staleness(r);
  const bool last_step = l_.max_steps > 0 && steps_ >= l_.max_steps;
  const bool epoch_full = static_cast<int64_t>(samples_) >= l_.samples_per_epoch;
  if (stop_ || last_step || (epoch_full && epoch_ + 1 >= l_.epochs)) {
    done_ = true;
    return verdict::end_run;
  }
  return epoch_full ? verdict::end_epoch : verdict::train_on;
}

void epoch_accumulator::add_staleness(const step_report& r) {
  if (!done_) tally_staleness(r);
}

void epoch_accumulator::tally_staleness(const step_report& r) {
  tau_sum_ += r.mean_staleness;
  ++tau_n_;
  tau_max_ = std::max<int64_t>(tau_max_, r.max_staleness);
  rejected_ += r.rejected;
  if (r.worker < worker_tau_.size()) {
    worker_tally& w = worker_tau_[r.worker];
    ++w.updates;
    w.tau_sum += r.mean_staleness;
    w.tau_max = std::max<int64_t>(w.tau_max, r.max_staleness);
    const auto bin = static_cast<std::size_t>(std::llround(std::max(0.0, r.mean_staleness)));
    if (bin >= w.histogram.size()) w.histogram.resize(bin + 1, 0);
    ++w.histogram[bin];
  }
}

epoch_metrics epoch_accumulator::close_epoch(double lr, time_point now) {
  epoch_metrics m;
  m.epoch = epoch_ + 1;
  m.train_s = std::chrono::duration<double>(now - epoch_start_).count();
  m.train_loss = reports_ ? loss_ / reports_ : 0;
  m.samples_per_s = m.train_s > 0 ? (samples_ - resumed_samples_) / m.train_s : 0;
  m.steps = steps_;
  m.lr = lr;
  m.mean_staleness = tau_n_ ? tau_sum_ / tau_n_ : 0;
  m.max_staleness = tau_max_;
  m.rejected = rejected_;
  m.lost_workers = lost_workers_;
  m.regroups = regroups_;
  m.dropped_reports = dropped_reports_;
  last_complete_ = static_cast<int64_t>(samples_) >= l_.samples_per_epoch;
  ++epoch_;
  epoch_start_ = now;
  samples_ = reports_ = resumed_samples_ = 0;
  loss_ = tau_sum_ = 0;
  tau_n_ = tau_max_ = rejected_ = regroups_ = dropped_reports_ = 0;
  return m;
}

std::vector<worker_summary> epoch_accumulator::worker_summaries() const {
  // The smallest staleness with at least a fraction q of the updates at or below it.
  const auto quantile = [](const std::vector<uint64_t>& h, uint64_t n, double q) {
    uint64_t seen = 0;
    for (std::size_t t = 0; t < h.size(); ++t)
      if ((seen += h[t]) >= q * static_cast<double>(n)) return static_cast<int64_t>(t);
    return static_cast<int64_t>(h.empty() ? 0 : h.size() - 1);
  };
  std::vector<worker_summary> out;
  for (std::size_t i = 0; i < worker_tau_.size(); ++i) {
    const worker_tally& w = worker_tau_[i];
    worker_summary s;
    s.worker = static_cast<int>(i);
    s.samples = worker_samples_[i];
    s.updates = w.updates;
    if (w.updates) {
      s.mean_staleness = w.tau_sum / static_cast<double>(w.updates);
      s.median_staleness = quantile(w.histogram, w.updates, 0.5);
      s.p90_staleness = quantile(w.histogram, w.updates, 0.9);
    }
    s.max_staleness = w.tau_max;
    s.compute_s = w.compute_s;
    out.push_back(s);
  }
  return out;
}

double epoch_accumulator::samples_per_s(time_point now) const {
  const double s = std::chrono::duration<double>(now - epoch_start_).count();
  return s > 0 ? (samples_ - resumed_samples_) / s : 0;
}

} // namespace troupe::train
