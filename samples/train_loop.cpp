#include "samples/train_loop.hpp"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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


std::string json_number(double v, int precision) {
  if (!std::isfinite(v)) return "null";
  std::ostringstream os;
  os << std::setprecision(precision) << v;
  return os.str();
}

} // namespace

progress_reporter::progress_reporter(std::ostream& log, const std::string& mode) : log_(log) {
  bar_ = mode == "bar" || (mode == "auto" && ::isatty(STDERR_FILENO));
  quiet_ = mode == "none";
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

const std::vector<std::string>& algorithms() {
  static const std::vector<std::string> a{"sequential", "ssgd",      "asgd",      "sa-asgd",
                                          "hogwild",    "dc-asgd-c", "dc-asgd-a", "ddc-asgd"};
  return a;
}

model::model build_model(const options& o, const data::image_dataset& train) {
  model::model m = zoo::by_name(o.model);
  m.build({train.channels, train.height, train.width}, o.seed);
  return m;
}

run_data load_data(const options& o, std::ostream& log) {
  const std::string dir = o.data_dir.empty() ? data::default_fashion_mnist_dir() : o.data_dir;
  run_data d{data::load_mnist_dir(dir), {}};
  d.norm = data::compute_normalization(d.sets.train);
  log << "data: " << d.sets.train.count << " train / " << d.sets.test.count << " test images from " << dir << "\n";
  return d;
}

double evaluate(const kernels::context& ctx, model::model& net, const data::image_dataset& test,
                const data::normalization& norm, int64_t batch_size) {
  // The training batch size: evaluation reuses the layers' buffers instead
  // of growing them (with batches of 1000 the CNN peaked at 726 MB RSS).
  data::batcher batches(test, batch_size, norm, 0, false);
  data::batch b;
  int64_t correct = 0;
  while (batches.next(b)) correct += kernels::count_correct(ctx, net.forward(ctx, b.images, false), b.labels);
  return test.count ? static_cast<double>(correct) / test.count : 0.0;
}

std::string describe(const epoch_metrics& m, const options& o) {
  std::ostringstream line;
  line << "epoch " << m.epoch << "/" << o.epochs << ": train loss " << std::fixed << std::setprecision(4)
       << m.train_loss;
  if (m.test_accuracy >= 0) line << ", test accuracy " << std::setprecision(2) << 100 * m.test_accuracy << "%";
  line << ", " << std::setprecision(0) << m.samples_per_s << " samples/s";
  if (o.algorithm != "sequential")
    line << ", staleness mean " << std::setprecision(2) << m.mean_staleness << " max " << m.max_staleness;
  if (m.rejected > 0) line << ", " << m.rejected << " pushes rejected";
  line << ", " << std::setprecision(1) << m.wall_s << " s";
  return line.str();
}

void open_metrics(const options& o, bool resuming, std::ofstream& out) {
  if (o.metrics_out.empty()) return;
  // A resumed run appends to the records of the epochs it continues.
  out.open(o.metrics_out, resuming ? std::ios::app : std::ios::trunc);
  if (!out) throw error("--metrics-out: cannot write " + o.metrics_out);
}

void write_metrics(std::ofstream& out, const epoch_metrics& m, const options& o) {
  if (!out.is_open()) return;
  out << to_json(m, o) << "\n" << std::flush;
  if (!out) throw error("--metrics-out: writing " + o.metrics_out + " failed");
}

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

bool resumes(const options& o) {
  struct stat st {};
  return !o.checkpoint.empty() && ::stat(o.checkpoint.c_str(), &st) == 0;
}

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
  const auto& algos = algorithms();
  if (std::find(algos.begin(), algos.end(), o.algorithm) == algos.end()) {
    std::string list;
    for (auto& a : algos) list += (list.empty() ? "" : ", ") + a;
    bad("--algorithm: unknown algorithm '" + o.algorithm + "' (choose " + list + ")");
  }
  if (o.workers < 1 || o.workers > 1024) bad("--workers must be in [1, 1024], got " + std::to_string(o.workers));
  if (o.shards < 1) bad("--shards must be at least 1, got " + std::to_string(o.shards));
  if (o.push_every < 1) bad("--push-every must be at least 1, got " + std::to_string(o.push_every));
  if (o.prefetch < 1) bad("--prefetch must be at least 1, got " + std::to_string(o.prefetch));
  if (!(o.worker_lr >= 0.0f) || !std::isfinite(o.worker_lr)) bad("--worker-lr must be >= 0 (0: use --lr)");
  if (!(o.worker_momentum >= 0.0f && o.worker_momentum < 1.0f)) bad("--worker-momentum must be in [0, 1)");
  if (!o.speeds.empty() && static_cast<int>(o.speeds.size()) != o.workers)
    bad("--speeds: " + std::to_string(o.speeds.size()) + " factors for " + std::to_string(o.workers) +
        " workers (give one per worker, e.g. 1,1,2,4)");
  for (float f : o.speeds)
    if (!(f >= 1.0f) || !std::isfinite(f)) bad("--speeds: every factor must be >= 1 (a slowdown), got " + std::to_string(f));
  if (o.algorithm == "sequential" && (o.workers != 1 || o.shards != 1 || o.push_every != 1 || !o.speeds.empty()))
    bad("--workers, --shards, --push-every and --speeds need an asynchronous --algorithm (e.g. --algorithm asgd)");
  if (o.algorithm == "hogwild" && (o.shards != 1 || o.push_every != 1))
    bad("--algorithm hogwild shares one buffer in this process: --shards and --push-every do not apply");
  if (o.algorithm == "ssgd" && o.push_every != 1) bad("--algorithm ssgd takes --push-every 1");
  if (o.algorithm != "sequential" && o.algorithm != "hogwild") {
    model::update_config c = o.rule;
    c.rule = o.algorithm;
    c.lr = o.lr;
    c.workers = o.workers;
    model::validate(c);
  }
}

std::string to_json(const epoch_metrics& m, const options& o) {
  std::ostringstream os;
  os << "{\"epoch\":" << m.epoch << ",\"model\":\"" << o.model << "\",\"train_loss\":" << json_number(m.train_loss, 6)
     << ",\"test_accuracy\":" << (m.test_accuracy < 0 ? "null" : json_number(m.test_accuracy, 6))
     << ",\"samples_per_s\":" << json_number(m.samples_per_s, 6) << ",\"train_s\":" << json_number(m.train_s, 6)
     << ",\"wall_s\":" << json_number(m.wall_s, 6) << ",\"steps\":" << m.steps
     << ",\"lr\":" << json_number(m.lr, 6) << ",\"batch_size\":" << o.batch_size
     << ",\"threads\":" << m.threads << ",\"peak_rss_mb\":" << json_number(m.peak_rss_mb, 5)
     << ",\"algorithm\":\"" << o.algorithm << "\",\"workers\":" << o.workers
     << ",\"mean_staleness\":" << json_number(m.mean_staleness, 6) << ",\"max_staleness\":" << m.max_staleness
     << ",\"rejected\":" << m.rejected << "}";
  return os.str();
}

std::vector<epoch_metrics> run(const options& o, std::ostream& log) {
  validate(o);
  const auto start = clock_type::now();
  const kernels::context ctx = kernels::context::with_threads(o.threads);

  // Open the metrics file first: a bad path fails before minutes of training.
  const bool resuming = resumes(o);
  std::ofstream metrics;
  open_metrics(o, resuming, metrics);

  run_data d = load_data(o, log);
  const data::train_test& ds = d.sets;
  const data::normalization& norm = d.norm;

  model::model net = build_model(o, ds.train);
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
      << ctx.threads << " threads\n";

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
      opt->set_learning_rate(model::scheduled_lr(o.lr, o.lr_schedule, steps, total_steps));
      const tensor& logits = net.forward(ctx, b.images, true);
      const double loss = kernels::softmax_cross_entropy(ctx, logits, b.labels, &dlogits);
      loss_sum += loss;
      net.backward(ctx, dlogits);
      opt->step(ctx, params);
      ++steps;
      ++batches;
      if (o.on_step) o.on_step(steps, loss);
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
    m.threads = ctx.threads;
    if (o.evaluate) m.test_accuracy = evaluate(ctx, net, ds.test, norm, o.batch_size);
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
    log << describe(m, o) << std::endl;
    write_metrics(metrics, m, o);
    out.push_back(m);
  }
  return out;
}

} // namespace troupe::train
