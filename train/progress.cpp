#include "train/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <string>

namespace troupe::train {

namespace {

double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

} // namespace

progress_reporter::progress_reporter(std::ostream& log, progress_mode mode, progress_options options)
    : log_(log), options_(std::move(options)) {
  bar_ = mode == progress_mode::bar || (mode == progress_mode::automatic && ::isatty(STDERR_FILENO));
  quiet_ = mode == progress_mode::none;
}

// The caller's rate r counts from the epoch's start: r = b d / E for d batches
// of b samples in E seconds. Two reports give E - E0 = b (d / r - d0 / r0), so
// the rate between them, b (d - d0) / (E - E0), is (d - d0) / (d / r - d0 / r0),
// whatever happened before the first (start-up, an evaluation).
double progress_reporter::rate_since_first_step(time_point now, int64_t done, double samples_per_s) const {
  if (seconds(now - first_step_) < options_.min_rate_span_s || done <= first_done_) return -1;
  if (!(samples_per_s > 0)) return -1;
  const double before = first_rate_ > 0 ? static_cast<double>(first_done_) / first_rate_ : 0;
  const double span = static_cast<double>(done) / samples_per_s - before;
  return span > 0 ? static_cast<double>(done - first_done_) / span : -1;
}

void progress_reporter::update(int epoch, int epochs, int64_t done, int64_t total, double loss, double samples_per_s) {
  if (quiet_) return;
  const time_point now = options_.clock();
  if (!started_ || epoch != epoch_) {
    if (!started_) last_ = bar_ ? now - std::chrono::hours(1) : now;  // a bar at once; the first line after a while
    started_ = true;
    epoch_ = epoch;
    first_step_ = now;
    first_done_ = done;
    first_rate_ = samples_per_s;
  }
  const double rate = rate_since_first_step(now, done, samples_per_s);
  std::ostringstream os;
  if (bar_) {
    if (seconds(now - last_) < 0.2 && done < total) return;
    const int width = 30;
    int filled = total ? static_cast<int>(width * std::min(done, total) / total) : width;
    os << "\repoch " << epoch << "/" << epochs << " [" << std::string(filled, '#') << std::string(width - filled, '.')
       << "] " << std::setw(3) << (total ? 100 * std::min(done, total) / total : 100) << "%  loss " << std::fixed
       << std::setprecision(4) << loss;
    if (rate >= 0) os << "  " << std::setprecision(0) << rate << " samples/s";
    os << " ";
    drawn_ = true;
  } else {
    if (seconds(now - last_) < options_.line_every_s) return;
    os << "epoch " << epoch << "/" << epochs << ": " << done << "/" << total << " batches, loss " << std::fixed
       << std::setprecision(4) << loss;
    if (rate >= 0) os << ", " << std::setprecision(0) << rate << " samples/s";
    os << "\n";
  }
  last_ = now;
  log_ << os.str() << std::flush;
}

void progress_reporter::finish_line() {
  if (drawn_) log_ << "\n";
  drawn_ = false;
}

} // namespace troupe::train
