#include "train/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <string>

#include "train/metrics.hpp"

namespace troupe::train {

progress_reporter::progress_reporter(std::ostream& log, progress_mode mode) : log_(log) {
  bar_ = mode == progress_mode::bar || (mode == progress_mode::automatic && ::isatty(STDERR_FILENO));
  quiet_ = mode == progress_mode::none;
}

void progress_reporter::update(int epoch, int epochs, int64_t done, int64_t total, double loss, double samples_per_s) {
  if (quiet_) return;
  double now = seconds_since(start_);
  if (bar_) {
    if (now - last_ < 0.2 && done < total) return;
    last_ = now;
    const int width = 30;
    int filled = total ? static_cast<int>(width * std::min(done, total) / total) : width;
    std::ostringstream os;
    os << "\repoch " << epoch << "/" << epochs << " [" << std::string(filled, '#')
       << std::string(width - filled, '.') << "] " << std::setw(3) << (total ? 100 * std::min(done, total) / total : 100)
       << "%  loss " << std::fixed << std::setprecision(4) << loss << "  " << std::setprecision(0)
       << samples_per_s << " samples/s ";
    log_ << os.str() << std::flush;
    drawn_ = true;
  } else if (now - last_ >= 10.0) {
    last_ = now;
    log_ << "epoch " << epoch << "/" << epochs << ": " << done << "/" << total << " batches, loss "
         << std::fixed << std::setprecision(4) << loss << ", " << std::setprecision(0) << samples_per_s
         << " samples/s" << std::endl;
  }
}

void progress_reporter::finish_line() {
  if (drawn_) log_ << "\n";
  drawn_ = false;
}

} // namespace troupe::train
