#include "samples/train_loop.hpp"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "data/dataset.hpp"
#include "kernels/kernels.hpp"
#include "model/optimizer.hpp"
#include "model/zoo.hpp"
#include "net/checkpoint.hpp"

namespace troupe::train {

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

bool file_exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

/// Progress on a terminal: one bar rewritten in place; elsewhere a plain
/// line every 10 seconds.
class progress_reporter {
public:
  progress_reporter(std::ostream& log, const std::string& mode) : log_(log) {
    bar_ = mode == "bar" || (mode == "auto" && ::isatty(STDERR_FILENO));
    quiet_ = mode == "none";
  }
  void update(int epoch, int epochs, int64_t done, int64_t total, double loss, double samples_per_s) {
    if (quiet_) return;
    double now = seconds_since(start_);
    if (bar_) {
      if (now - last_ < 0.2 && done < total) return;
      last_ = now;
      const int width = 30;
      int filled = total ? static_cast<int>(width * done / total) : width;
      std::ostringstream os;
      os << "\repoch " << epoch << "/" << epochs << " [" << std::string(filled, '#')
         << std::string(width - filled, '.') << "] " << std::setw(3) << (total ? 100 * done / total : 100)
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
  /// Ends the bar's line before a regular log line.
  void finish_line() {
    if (drawn_) log_ << "\n";
    drawn_ = false;
  }

private:
  std::ostream& log_;
  bool bar_ = false, quiet_ = false, drawn_ = false;
  clock_type::time_point start_ = clock_type::now();
  double last_ = 0;
};

std::string json_number(double v, int precision) {
  if (!std::isfinite(v)) return "null";
  std::ostringstream os;
  os << std::setprecision(precision) << v;
  return os.str();
}

} // namespace

double peak_rss_mb() {
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;  // Linux reports KiB
}

void validate(const options& o) {
  auto bad = [](const std::string& m) { throw error(m); };
  if (o.model != "mlp" && o.model != "cnn") bad("--model: unknown model '" + o.model + "' (choose mlp or cnn)");
  if (o.epochs < 1) bad("--epochs must be at least 1, got " + std::to_string(o.epochs));
  if (o.batch_size < 1) bad("--batch-size must be at least 1, got " + std::to_string(o.batch_size));
  if (!(o.lr > 0.0f) || !std::isfinite(o.lr)) bad("--lr must be a positive number, got " + std::to_string(o.lr));
  if (!(o.momentum >= 0.0f && o.momentum < 1.0f)) bad("--momentum must be in [0, 1), got " + std::to_string(o.momentum));
  if (!(o.weight_decay >= 0.0f)) bad("--weight-decay must be >= 0");
  if (o.lr_schedule != "constant" && o.lr_schedule != "cosine")
    bad("--lr-schedule: unknown schedule '" + o.lr_schedule + "' (choose constant or cosine)");
  if (o.threads < 0) bad("--threads must be >= 0 (0 = all cores), got " + std::to_string(o.threads));
  if (o.max_steps < 0) bad("--max-steps must be >= 0");
  if (o.progress != "auto" && o.progress != "bar" && o.progress != "lines" && o.progress != "none")
    bad("--progress: choose auto, bar, lines or none, not '" + o.progress + "'");
}

std::string to_json(const epoch_metrics& m, const options& o) {
  std::ostringstream os;
  os << "{\"epoch\":" << m.epoch << ",\"model\":\"" << o.model << "\",\"train_loss\":" << json_number(m.train_loss, 6)
     << ",\"test_accuracy\":" << (m.test_accuracy < 0 ? "null" : json_number(m.test_accuracy, 6))
     << ",\"samples_per_s\":" << json_number(m.samples_per_s, 6) << ",\"train_s\":" << json_number(m.train_s, 6)
     << ",\"wall_s\":" << json_number(m.wall_s, 6) << ",\"steps\":" << m.steps
     << ",\"lr\":" << json_number(m.lr, 6) << ",\"batch_size\":" << o.batch_size
     << ",\"threads\":" << kernels::num_threads() << ",\"peak_rss_mb\":" << json_number(m.peak_rss_mb, 5) << "}";
  return os.str();
}

std::vector<epoch_metrics> run(const options& o, std::ostream& log) {
  validate(o);
  const auto start = clock_type::now();
  kernels::set_num_threads(o.threads);

  // Open the metrics file first: a bad path fails before minutes of training.
  const bool resuming = !o.checkpoint.empty() && file_exists(o.checkpoint);
  std::ofstream metrics;
  if (!o.metrics_out.empty()) {
    // A resumed run appends to the records of the epochs it continues.
    metrics.open(o.metrics_out, resuming ? std::ios::app : std::ios::trunc);
    if (!metrics) throw error("--metrics-out: cannot write " + o.metrics_out);
  }

  const std::string dir = o.data_dir.empty() ? data::default_fashion_mnist_dir() : o.data_dir;
  data::train_test ds = data::load_mnist_dir(dir);
  data::normalization norm = data::compute_normalization(ds.train);
  log << "data: " << ds.train.count << " train / " << ds.test.count << " test images from " << dir << "\n";

  model::model net = zoo::by_name(o.model);
  net.build({ds.train.channels, ds.train.height, ds.train.width}, o.seed);
  auto params = net.parameters();
  std::unique_ptr<model::optimizer> opt =
      optim::sgd(o.lr).momentum(o.momentum).weight_decay(o.weight_decay).make();

  int first_epoch = 0;
  int64_t steps = 0;
  if (resuming) {
    net::checkpoint c = net::load_checkpoint(o.checkpoint);
    net.load_state(c.architecture, c.params);
    opt->load_state(params, c.optimizer);
    first_epoch = static_cast<int>(c.epoch);
    steps = static_cast<int64_t>(c.step);
    log << "resumed from " << o.checkpoint << " after epoch " << first_epoch << " (" << steps << " steps)\n";
  }
  log << "model " << o.model << ": " << net.num_parameters() << " parameters, " << opt->describe() << ", "
      << kernels::num_threads() << " threads\n";

  data::batcher train_batches(ds.train, o.batch_size, norm, o.seed);
  const int64_t per_epoch = train_batches.batches_per_epoch();
  const int64_t total_steps = per_epoch * o.epochs;
  progress_reporter progress(log, o.progress);
  std::vector<epoch_metrics> out;
  data::batch b;
  tensor dlogits;

  for (int epoch = first_epoch; epoch < o.epochs; ++epoch) {
    if (o.max_steps && steps >= o.max_steps) break;
    train_batches.start_epoch(epoch);
    const auto t0 = clock_type::now();
    double loss_sum = 0;
    int64_t batches = 0, samples = 0;
    while (train_batches.next(b)) {
      if (o.lr_schedule == "cosine")
        opt->set_learning_rate(static_cast<float>(0.5 * o.lr * (1 + std::cos(M_PI * steps / double(total_steps)))));
      const tensor& logits = net.forward(b.images, true);
      loss_sum += kernels::softmax_cross_entropy(logits, b.labels, &dlogits);
      net.backward(dlogits);
      opt->step(params);
      ++steps;
      ++batches;
      samples += b.size();
      progress.update(epoch + 1, o.epochs, batches, per_epoch, loss_sum / batches, samples / seconds_since(t0));
      if (o.max_steps && steps >= o.max_steps) break;
    }
    epoch_metrics m;
    m.epoch = epoch + 1;
    m.train_s = seconds_since(t0);
    m.train_loss = batches ? loss_sum / batches : 0;
    m.samples_per_s = m.train_s > 0 ? samples / m.train_s : 0;
    m.steps = steps;
    m.lr = opt->learning_rate();
    if (o.evaluate) {
      // The training batch size: evaluation reuses the layers' buffers instead
      // of growing them (with batches of 1000 the CNN peaked at 726 MB RSS).
      data::batcher test_batches(ds.test, o.batch_size, norm, 0, false);
      int64_t correct = 0;
      while (test_batches.next(b)) correct += kernels::count_correct(net.forward(b.images, false), b.labels);
      m.test_accuracy = static_cast<double>(correct) / ds.test.count;
    }
    if (!o.checkpoint.empty()) {
      net::checkpoint c;
      c.architecture = net.architecture();
      // Only a finished epoch counts: a run stopped by --max-steps redoes that epoch on resume.
      c.epoch = static_cast<uint32_t>(batches == per_epoch ? epoch + 1 : epoch);
      c.step = static_cast<uint64_t>(steps);
      c.params = net.state();
      c.optimizer = opt->state();
      c.optimizer_kind = opt->describe();
      net::save_checkpoint(o.checkpoint, c);
    }
    m.wall_s = seconds_since(start);
    m.peak_rss_mb = peak_rss_mb();
    progress.finish_line();
    std::ostringstream line;
    line << "epoch " << m.epoch << "/" << o.epochs << ": train loss " << std::fixed << std::setprecision(4)
         << m.train_loss;
    if (m.test_accuracy >= 0) line << ", test accuracy " << std::setprecision(2) << 100 * m.test_accuracy << "%";
    line << ", " << std::setprecision(0) << m.samples_per_s << " samples/s, " << std::setprecision(1) << m.wall_s
         << " s";
    log << line.str() << std::endl;
    if (metrics.is_open()) {
      metrics << to_json(m, o) << "\n" << std::flush;
      if (!metrics) throw error("--metrics-out: writing " + o.metrics_out + " failed");
    }
    out.push_back(m);
  }
  return out;
}

} // namespace troupe::train
