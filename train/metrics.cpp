#include "train/metrics.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tensor/error.hpp"

namespace troupe::train {

namespace {

/// `v` to `digits` significant digits (the records keep what a reader needs,
/// not float noise such as lr 0.019999999552965164); null when not finite.
nlohmann::ordered_json number(double v, int digits = 6) {
  if (!std::isfinite(v)) return nullptr;
  if (v == 0) return 0.0;
  std::ostringstream os;
  os << std::setprecision(digits) << v;
  return std::stod(os.str());
}

/// A worker's compute per step of batch_size samples; -1 when it measured none.
double compute_ms_per_step(const worker_summary& s, const run_info& r) {
  if (s.compute_s <= 0 || s.samples == 0 || r.batch_size <= 0) return -1;
  return 1e3 * s.compute_s * static_cast<double>(r.batch_size) / static_cast<double>(s.samples);
}

} // namespace

std::string to_json(const epoch_metrics& m, const run_info& r) {
  nlohmann::ordered_json j;
  j["epoch"] = m.epoch;
  j["model"] = r.model;
  j["train_loss"] = number(m.train_loss);
  j["test_accuracy"] = m.test_accuracy < 0 ? nlohmann::ordered_json(nullptr) : number(m.test_accuracy);
  if (m.validation_accuracy >= 0) j["validation_accuracy"] = number(m.validation_accuracy);
  if (r.language_model) {
    const auto or_null = [](double v) { return v < 0 ? nlohmann::ordered_json(nullptr) : number(v); };
    j["test_loss"] = or_null(m.test_loss);
    j["perplexity"] = or_null(m.perplexity);
    j["bits_per_char"] = or_null(m.bits_per_char);
    if (m.validation_loss >= 0) j["validation_loss"] = number(m.validation_loss);
    if (!m.sample.empty()) j["sample"] = m.sample;
  }
  j["samples_per_s"] = number(m.samples_per_s);
  if (r.language_model) j["tokens_per_s"] = number(m.samples_per_s * static_cast<double>(r.tokens_per_sample));
  j["train_s"] = number(m.train_s);
  j["wall_s"] = number(m.wall_s);
  j["steps"] = m.steps;
  j["lr"] = number(m.lr);
  j["batch_size"] = r.batch_size;
  j["threads"] = r.threads;
  j["peak_rss_mb"] = number(m.peak_rss_mb, 5);
  j["algorithm"] = r.algorithm;
  j["workers"] = r.workers;
  j["pipeline_stages"] = r.pipeline_stages;
  j["mean_staleness"] = number(m.mean_staleness);
  j["max_staleness"] = m.max_staleness;
  j["rejected"] = m.rejected;
  j["lost_workers"] = m.lost_workers;
  if (r.collective) {
    j["regroups"] = m.regroups;
    j["dropped_reports"] = m.dropped_reports;
  }
  if (!m.link_rejections.empty()) j["link_rejections"] = m.link_rejections;
  // A sample's bytes need not be UTF-8 (a byte vocabulary): replaced, not thrown.
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::string to_json(const std::vector<worker_summary>& w, const run_info& r) {
  nlohmann::ordered_json j, list = nlohmann::ordered_json::array();
  for (const worker_summary& s : w) {
    nlohmann::ordered_json e = {{"worker", s.worker},
                                {"samples", s.samples},
                                {"updates", s.updates},
                                {"mean_staleness", number(s.mean_staleness)},
                                {"median_staleness", s.median_staleness},
                                {"p90_staleness", s.p90_staleness},
                                {"max_staleness", s.max_staleness}};
    if (const double ms = compute_ms_per_step(s, r); ms >= 0) {
      e["compute_s"] = number(s.compute_s);
      e["compute_ms_per_step"] = number(ms);
    }
    list.push_back(std::move(e));
  }
  j["workers_summary"] = std::move(list);
  j["algorithm"] = r.algorithm;
  j["workers"] = r.workers;
  return j.dump();
}

std::string describe_compute(const std::vector<worker_summary>& w, const run_info& r, double train_s) {
  std::vector<double> ms, busy_s;  // of the workers that measured it
  for (const worker_summary& s : w)
    if (const double m = compute_ms_per_step(s, r); m >= 0) {
      ms.push_back(m);
      busy_s.push_back(s.compute_s);
    }
  if (ms.empty()) return "";
  const auto [lo_ms, hi_ms] = std::minmax_element(ms.begin(), ms.end());
  const auto [lo_busy, hi_busy] = std::minmax_element(busy_s.begin(), busy_s.end());
  const double percent = train_s > 0 ? 100 / train_s : 0;
  std::ostringstream line;
  line << std::fixed << std::setprecision(2) << "compute per worker (forward, backward, hand-off, as it ran): "
       << *lo_ms << "-" << *hi_ms << " ms a step, busy " << std::setprecision(0) << *lo_busy * percent << "-"
       << *hi_busy * percent << " % of the " << std::setprecision(1) << train_s
       << " s of training (the rest waiting for the network or the cores)";
  return line.str();
}

std::string describe(const epoch_metrics& m, const run_info& r) {
  std::ostringstream line;
  line << "epoch " << m.epoch << "/" << r.epochs << ": train loss " << std::fixed << std::setprecision(4)
       << m.train_loss;
  if (r.language_model && m.test_loss >= 0)
    line << ", test loss " << std::setprecision(4) << m.test_loss << " (" << std::setprecision(3) << m.bits_per_char
         << " bits/char, perplexity " << std::setprecision(2) << m.perplexity << ")";
  if (r.language_model && m.validation_loss >= 0) line << ", validation loss " << std::setprecision(4) << m.validation_loss;
  if (m.test_accuracy >= 0)
    line << (r.language_model ? ", next-token accuracy " : ", test accuracy ") << std::setprecision(2)
         << 100 * m.test_accuracy << "%";
  if (m.validation_accuracy >= 0) line << ", validation " << std::setprecision(2) << 100 * m.validation_accuracy << "%";
  line << ", " << std::setprecision(0) << m.samples_per_s << " samples/s";
  if (r.language_model && r.tokens_per_sample > 0)
    line << " (" << m.samples_per_s * static_cast<double>(r.tokens_per_sample) << " tokens/s)";
  if (r.asynchronous)
    line << ", staleness mean " << std::setprecision(2) << m.mean_staleness << " max " << m.max_staleness;
  if (m.rejected > 0) line << ", " << m.rejected << " pushes rejected";
  if (m.lost_workers > 0) line << ", " << m.lost_workers << " worker(s) lost";
  if (m.regroups > 0) line << ", group re-formed " << m.regroups << "x";
  line << ", " << std::setprecision(1) << m.wall_s << " s";
  if (!m.sample.empty()) line << "\nsample: " << m.sample;
  return line.str();
}

metrics_file::metrics_file(const std::string& path, bool append) : path_(path) {
  if (path.empty()) return;
  // A resumed run appends to the records of the epochs it continues.
  out_.open(path, append ? std::ios::app : std::ios::trunc);
  if (!out_) throw error("--metrics-out: cannot write " + path);
}

void metrics_file::write(const epoch_metrics& m, const run_info& r) { write_line(to_json(m, r)); }
void metrics_file::write(const std::vector<worker_summary>& w, const run_info& r) { write_line(to_json(w, r)); }

void metrics_file::write_line(const std::string& line) {
  if (!out_.is_open()) return;
  out_ << line << "\n" << std::flush;
  if (!out_) throw error("--metrics-out: writing " + path_ + " failed");
}

double peak_rss_mb() {
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;  // Linux reports KiB
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

} // namespace troupe::train
