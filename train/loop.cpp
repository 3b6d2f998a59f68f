#include "train/loop.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <ostream>
#include <utility>

#include "kernels/kernels.hpp"
#include "kernels/sequence.hpp"
#include "model/init.hpp"
#include "model/loss.hpp"
#include "model/optimizer.hpp"
#include "net/checkpoint.hpp"
#include "train/cluster.hpp"
#include "train/epoch_accumulator.hpp"
#include "train/generate.hpp"
#include "train/optimizers.hpp"
#include "train/plan.hpp"
#include "train/progress.hpp"

namespace troupe::train {

namespace {

/// A language model's corpus, split, every part checked to hold a window.
std::shared_ptr<const text_data> load_text(const job& j, std::ostream& log) {
  auto t = std::make_shared<text_data>();
  t->corpus = j.data_source().load_text();
  t->windows = j.data_source().windows();
  data::text_split_options split;
  split.validation = j.config().validation_fraction;
  split.regions = std::min<int64_t>(split.regions, t->corpus.size());
  t->parts = t->corpus.split(split);
  for (const data::text_part* p : {&t->parts.train, &t->parts.validation, &t->parts.test})
    if (!p->regions.empty()) data::window_sampler(t->corpus, *p, t->windows.context, 0);  // throws when too short
  log << "data: " << t->parts.train.tokens() << " train / ";
  if (t->parts.validation.tokens()) log << t->parts.validation.tokens() << " validation / ";
  log << t->parts.test.tokens() << " test tokens (a vocabulary of " << t->corpus.vocab_size() << ") from "
      << j.data_source().description() << "; windows of " << t->windows.context << " tokens, "
      << t->windows.windows_per_epoch << " per epoch\n";
  return t;
}

} // namespace

shape loaded_data::sample_shape() const { return text ? shape({text->windows.context}) : sets.train.sample_shape(); }

int64_t loaded_data::train_samples() const { return text ? text->windows.windows_per_epoch : sets.train.count; }

std::string loaded_data::vocabulary() const { return text ? text->corpus.vocabulary() : std::string(); }

model::model build_model(const job& j, const loaded_data& d, bool to_load) {
  std::optional<model::no_initial_draws> values_from_the_checkpoint;
  if (to_load) values_from_the_checkpoint.emplace();
  model::model m = j.build_model(d.sample_shape(), d.text ? d.text->corpus.vocab_size() : 0);
  // The loss takes a logit per class (more are allowed, never targeted): say so here rather than at the
  // first label past the outputs.
  const int64_t classes = d.text ? 0 : d.sets.train.num_classes;
  const shape& out = m.output_shape();
  if (classes > 0 && (out.rank() != 1 || out[0] < classes))
    throw error("model " + j.model_name() + " gives " + out.to_string() + " outputs per sample, but the data has " +
                std::to_string(classes) + " classes: end the model with " + std::to_string(classes) +
                " outputs (e.g. dense(..., " + std::to_string(classes) + "))");
  return m;
}

void check_vocabulary(const std::string& path, const std::string& vocabulary, const loaded_data& d) {
  if (vocabulary == d.vocabulary()) return;
  throw error("checkpoint " + path + " holds a vocabulary of " + std::to_string(vocabulary.size()) +
              " bytes that is not this corpus's (" + std::to_string(d.vocabulary().size()) +
              " bytes): resume on the text it was trained on, or give another --checkpoint");
}

loaded_data load_data(const job& j, std::ostream& log) {
  if (j.data_source().is_text()) {
    loaded_data d;
    d.text = load_text(j, log);
    return d;
  }
  loaded_data d{j.data_source().load(), {}, {}, nullptr};
  const double f = j.config().validation_fraction;
  if (f > 0)
    d.validation = data::split_off(d.sets.train, std::max<int64_t>(1, static_cast<int64_t>(f * d.sets.train.count)));
  d.norm = data::compute_normalization(d.sets.train);
  log << "data: " << d.sets.train.count << " train / ";
  if (d.validation.count) log << d.validation.count << " validation (held out) / ";
  log << d.sets.test.count << " test samples from " << j.data_source().description() << "\n";
  return d;
}

run_info info_of(const job& j, int threads) {
  const settings& s = j.config();
  run_info r;
  r.model = j.model_name();
  r.algorithm = to_string(s.algo.kind);
  r.epochs = s.epochs;
  r.batch_size = s.batch_size;
  r.threads = threads;
  r.workers = s.algo.workers;
  r.pipeline_stages = s.pipeline.stages;
  r.asynchronous = traits(s.algo.kind).on_actors && !traits(s.algo.kind).synchronous;
  r.collective = traits(s.algo.kind).collective;
  r.language_model = j.language_model();
  if (r.language_model) r.tokens_per_sample = j.data_source().windows().context;
  return r;
}

test_score score(model::model& net, const kernels::context& ctx, const data::image_dataset& test,
                 const data::normalization& norm, int64_t batch_size) {
  // The training batch size: evaluation reuses the layers' buffers instead
  // of growing them (with batches of 1000 the CNN peaked at 726 MB RSS).
  data::batcher batches(test, batch_size, norm, 0, false);
  batches.set_threads(ctx.threads);
  data::batch b;
  int64_t correct = 0;
  double loss_sum = 0;
  test_score out;
  while (batches.next(b)) {
    const tensor& logits = net.forward(ctx, b.images, false);
    correct += kernels::count_correct(ctx, logits, b.labels);
    loss_sum += kernels::softmax_cross_entropy(ctx, logits, b.labels, nullptr) * static_cast<double>(b.size());
    out.samples += b.size();
  }
  if (out.samples) {
    out.accuracy = static_cast<double>(correct) / out.samples;
    out.loss = loss_sum / out.samples;
  }
  return out;
}

test_score score_text(model::model& net, const kernels::context& ctx, const text_data& t, const data::text_part& part,
                      int64_t batch_size) {
  data::window_sampler windows(t.corpus, part, t.windows.context, 0x5c0de);
  data::text_batch b;
  int64_t correct = 0;
  double loss_sum = 0;
  test_score out;
  const int64_t batch = std::max<int64_t>(1, std::min(batch_size, text_score_tokens / t.windows.context));
  for (int64_t done = 0; done < text_score_windows; done += b.size()) {
    windows.sample(std::min(batch, text_score_windows - done), b);
    const tensor& logits = net.forward(ctx, b.inputs, false);
    const auto tokens = static_cast<int64_t>(b.targets.size());
    correct += kernels::count_correct(ctx, logits.reshape({tokens, logits.dim(2)}), b.targets);
    loss_sum += kernels::sequence_cross_entropy(ctx, logits, kernels::token_ids::of(b.targets, b.size()), nullptr) *
                static_cast<double>(tokens);
    out.samples += tokens;
  }
  out.accuracy = static_cast<double>(correct) / static_cast<double>(out.samples);
  out.loss = loss_sum / static_cast<double>(out.samples);
  return out;
}

accuracies score_sets(model::model& net, const kernels::context& ctx, const loaded_data& d, int64_t batch_size,
                      int64_t sample_tokens) {
  accuracies a;
  if (d.text) {
    if (sample_tokens > 0) {
      generate_options o;
      o.tokens = sample_tokens;
      o.temperature = 0.8f;
      o.top_k = 20;
      o.threads = ctx.threads;
      a.sample = generate(net, d.vocabulary(), o);
    }
    const test_score t = score_text(net, ctx, *d.text, d.text->parts.test, batch_size);
    a.test = t.accuracy;
    a.test_loss = t.loss;
    if (!d.text->parts.validation.regions.empty()) {
      const test_score v = score_text(net, ctx, *d.text, d.text->parts.validation, batch_size);
      a.validation = v.accuracy;
      a.validation_loss = v.loss;
    }
    return a;
  }
  a.test = score(net, ctx, d.sets.test, d.norm, batch_size).accuracy;
  if (d.validation.count) a.validation = score(net, ctx, d.validation, d.norm, batch_size).accuracy;
  return a;
}

void estimate_batch_norm(model::model& net, const kernels::context& ctx, const data::image_dataset& train,
                         const data::normalization& norm, int64_t batch_size, int64_t batches, uint64_t seed) {
  if (net.state().size() == net.parameters().size()) return;
  data::batcher b(train, batch_size, norm, seed);
  b.start_epoch(0);
  data::batch x;
  // Batch norm's running averages forget their start at (1 - momentum) per batch.
  for (int64_t i = 0; i < batches && b.next(x); ++i) net.forward(ctx, x.images, true);
}

bool resumes(const settings& s) {
  struct stat st {};
  return !s.checkpoint.empty() && ::stat(s.checkpoint.c_str(), &st) == 0;
}

bool epoch_callback(const job& j, const epoch_metrics& m) {
  if (!j.epoch_callback()) return false;
  bool stop = false;
  epoch_event e;
  static_cast<epoch_metrics&>(e) = m;
  e.stop_ = &stop;
  j.epoch_callback()(e);
  return stop;
}

namespace {

/// `epoch_samples`: samples of the epoch after `epochs_done` trained so far.
void save(const std::string& path, model::model& net, const model::optimizer& opt, const loaded_data& d,
          uint32_t epochs_done, int64_t steps, int64_t epoch_samples) {
  net::checkpoint c;
  c.vocabulary = d.vocabulary();
  c.architecture = net.architecture();
  c.epoch = epochs_done;
  c.step = static_cast<uint64_t>(steps);
  c.epoch_samples = static_cast<uint64_t>(epoch_samples);
  c.params = net.state();
  c.optimizer = opt.state();
  c.optimizer_kind = opt.describe();
  net::save_checkpoint(path, c);
}

/// Where a run starts: after `epochs` epochs and `steps` steps, and
/// `epoch_samples` samples into the next epoch.
struct start_point {
  int epochs = 0;
  int64_t steps = 0;
  int64_t epoch_samples = 0;
};

/// Continues `net` and `opt` from the checkpoint `path`; `samples_per_epoch`
/// bounds a position inside an epoch (a checkpoint of another data set).
start_point resume(const std::string& path, model::model& net, model::optimizer& opt, const loaded_data& d,
                   int64_t samples_per_epoch, std::ostream& log) {
  net::checkpoint c = net::load_checkpoint(path);
  check_vocabulary(path, c.vocabulary, d);
  net.load_state(c.architecture, c.params);
  opt.load_state(net.parameters(), c.optimizer);
  start_point p{static_cast<int>(c.epoch), static_cast<int64_t>(c.step), 0};
  p.epoch_samples = log_resume(path, p.epochs, p.steps, static_cast<int64_t>(c.epoch_samples), samples_per_epoch, log);
  return p;
}


/// A run's training batches: shuffled images with one label each, or random
/// windows of text with a next token at each position (a language model).
class train_batches {
public:
  train_batches(const loaded_data& d, const settings& s)
      : d_(d), s_(s), images_(d.sets.train, s.batch_size, d.norm, s.seed) {}
  void set_threads(int threads) { images_.set_threads(threads); }
  /// Samples (text: windows) in an epoch, and the batches they make.
  int64_t samples_per_epoch() const { return d_.train_samples(); }
  int64_t batches_per_epoch() const {
    return d_.text ? (samples_per_epoch() + s_.batch_size - 1) / s_.batch_size : images_.batches_per_epoch();
  }
  /// Starts `epoch` (0-based): a permutation, or a window sampler, drawn from (seed, epoch).
  void start_epoch(int epoch) {
    if (!d_.text) return images_.start_epoch(epoch);
    windows_.emplace(d_.text->corpus, d_.text->parts.train, d_.text->windows.context, data::epoch_seed(s_.seed, epoch));
    drawn_ = 0;
  }
  /// The next batch; false when the epoch is over.
  bool next() {
    if (!d_.text) return images_.next(images_batch_);
    if (drawn_ >= samples_per_epoch()) return false;
    windows_->sample(std::min(s_.batch_size, samples_per_epoch() - drawn_), text_batch_);
    drawn_ += text_batch_.size();
    return true;
  }
  /// Skips the first `samples` of the epoch (trained before a resume).
  void skip(int64_t samples) {
    for (int64_t done = 0; done < samples && next();) done += size();
  }
  const tensor& inputs() const { return d_.text ? text_batch_.inputs : images_batch_.images; }
  int64_t size() const { return d_.text ? text_batch_.size() : images_batch_.size(); }
  /// The batch's mean loss of `logits` (per token for text), its gradient in `dlogits`.
  double loss(const kernels::context& ctx, const tensor& logits, tensor& dlogits) const {
    return model::cross_entropy(ctx, logits, d_.text ? text_batch_.targets : images_batch_.labels, &dlogits);
  }

private:
  const loaded_data& d_;
  const settings& s_;
  data::batcher images_;
  data::batch images_batch_;
  std::optional<data::window_sampler> windows_;
  data::text_batch text_batch_;
  int64_t drawn_ = 0;
};

/// The epochs of a sequential run, once run_sequential has set up the model, its optimizer, the data and
/// where the run starts: train() trains one epoch, close() ends it (scores and checkpoints it).
class sequential_epochs {
public:
  sequential_epochs(const job& j, const kernels::context& ctx, const loaded_data& d, model::model& net,
                    model::optimizer& opt, const start_point& from, std::ostream& log)
      : j_(j), s_(j.config()), ctx_(ctx), d_(d), net_(net), params_(net.parameters()), opt_(opt), from_(from),
        batches_(d, s_), per_epoch_(batches_.batches_per_epoch()),
        total_steps_((per_epoch_ + s_.accumulate - 1) / s_.accumulate * s_.epochs),
        acc_({batches_.samples_per_epoch(), per_epoch_, s_.epochs, from.epochs, from.steps, s_.max_steps, 1, from.epoch_samples},
             std::chrono::steady_clock::now()),
        progress_(log, s_.progress),
        periodic_(s_.checkpoint_every_steps, s_.checkpoint_every_s, from.steps, std::chrono::steady_clock::now()) {
    batches_.set_threads(ctx.threads);
  }

  /// Trains `epoch` (the rest of it when a checkpoint is inside it) until its batches end or the
  /// accumulator says the epoch or the run is over; that verdict.
  epoch_accumulator::verdict train(int epoch) {
    batches_.start_epoch(epoch);
    // A checkpoint inside this epoch: its first samples are trained already.
    if (epoch == from_.epochs) batches_.skip(from_.epoch_samples);
    auto verdict = epoch_accumulator::verdict::train_on;
    while (verdict == epoch_accumulator::verdict::train_on) {
      if (!batches_.next()) {  // the epoch's batches are over: a step of those still accumulated
        if (pending_.batches > 0) verdict = step(epoch, pending_.mean_loss());
        break;
      }
      const tensor& logits = net_.forward(ctx_, batches_.inputs(), true);
      const double loss = batches_.loss(ctx_, logits, dlogits_);
      net_.backward(ctx_, dlogits_);
      if (s_.accumulate == 1) {
        verdict = step(epoch, loss);
        continue;
      }
      pending_.add(ctx_, params_, loss, batches_.size());
      if (pending_.batches == s_.accumulate) verdict = step(epoch, pending_.mean_loss());
    }
    return verdict;
  }

  /// Ends `epoch`: its metrics, scored on the test (and validation) sets when the job evaluates, with
  /// the time since `start`; the checkpoint written when the job names one.
  epoch_metrics close(int epoch, std::chrono::steady_clock::time_point start) {
    const int64_t epoch_samples = acc_.epoch_samples();
    epoch_metrics m = acc_.close_epoch(opt_.learning_rate(), std::chrono::steady_clock::now());
    if (s_.evaluate) {
      const accuracies a = score_sets(net_, ctx_, d_, s_.batch_size, s_.sample_tokens);
      m.test_accuracy = a.test;
      m.validation_accuracy = a.validation;
      if (d_.text) set_losses(m, a);
    }
    // A run cut inside an epoch records where in it: a resumed run trains the rest.
    if (!s_.checkpoint.empty()) {
      const bool complete = acc_.last_closed_complete();
      save(s_.checkpoint, net_, opt_, d_, static_cast<uint32_t>(complete ? epoch + 1 : epoch), m.steps,
           complete ? 0 : epoch_samples);
    }
    m.wall_s = seconds_since(start);
    m.peak_rss_mb = peak_rss_mb();
    progress_.finish_line();
    return m;
  }

private:
  /// The gradients of the batches a step has taken so far (settings::accumulate), each weighted by
  /// its samples, and their losses.
  struct accumulated {
    std::vector<tensor> sums;  // per parameter: the sum over the batches of samples x gradient
    int64_t batches = 0, samples = 0;
    double loss = 0;  // the sum of samples x mean loss
    void add(const kernels::context& ctx, const std::vector<model::parameter*>& params, double batch_loss,
             int64_t size) {
      if (sums.empty())
        for (model::parameter* p : params) sums.push_back(tensor::zeros(p->grad.shape()));
      for (std::size_t i = 0; i < params.size(); ++i)
        kernels::axpy(ctx, sums[i].numel(), static_cast<float>(size), params[i]->grad.data(), sums[i].data());
      ++batches;
      samples += size;
      loss += batch_loss * static_cast<double>(size);
    }
    double mean_loss() const { return loss / static_cast<double>(samples); }
    /// Every parameter's gradient becomes the mean over the samples; the sums start again.
    void into(const kernels::context& ctx, const std::vector<model::parameter*>& params) {
      for (std::size_t i = 0; i < params.size(); ++i) {
        params[i]->grad.fill(0.0f);
        kernels::axpy(ctx, sums[i].numel(), 1.0f / static_cast<float>(samples), sums[i].data(), params[i]->grad.data());
        sums[i].fill(0.0f);
      }
      batches = samples = 0;
      loss = 0;
    }
  };

  /// The optimizer's step on the gradients of the batches since the last (the one batch in
  /// parameters' gradients, or those accumulated), with the mean loss `loss`; the accumulator's verdict.
  epoch_accumulator::verdict step(int epoch, double loss) {
    const int64_t samples = pending_.batches > 0 ? pending_.samples : batches_.size();
    if (pending_.batches > 0) pending_.into(ctx_, params_);
    opt_.set_learning_rate(model::scheduled_lr(s_.lr, s_.schedule, acc_.steps(), total_steps_, s_.warmup_steps));
    if (s_.clip_grad_norm > 0) kernels::clip_by_global_norm(ctx_, grad_parts(), s_.clip_grad_norm);
    opt_.step(ctx_, params_);
    if (j_.step_callback()) {
      step_event e{acc_.steps() + 1, epoch + 1, loss, 0, &stop_};
      j_.step_callback()(e);
      if (stop_) acc_.request_stop();
    }
    const auto verdict = acc_.add({0, static_cast<uint64_t>(acc_.steps() + 1), loss, static_cast<uint64_t>(samples)});
    // Inside an epoch: a resumed run trains the rest of it.
    if (verdict == epoch_accumulator::verdict::train_on && periodic_.due(acc_.steps(), std::chrono::steady_clock::now()))
      save(s_.checkpoint, net_, opt_, d_, static_cast<uint32_t>(epoch), acc_.steps(), acc_.epoch_samples());
    progress_.update(epoch + 1, s_.epochs, acc_.batches_done(s_.batch_size), per_epoch_, acc_.mean_loss(),
                     acc_.samples_per_s(std::chrono::steady_clock::now()));
    return verdict;
  }

  const job& j_;
  const settings& s_;
  const kernels::context& ctx_;
  const loaded_data& d_;
  model::model& net_;
  std::vector<model::parameter*> params_;
  /// Every parameter's gradient, in the layout's order (gradient clipping's parts).
  std::vector<std::pair<float*, int64_t>> grad_parts() const {
    std::vector<std::pair<float*, int64_t>> out;
    for (model::parameter* p : params_) out.emplace_back(p->grad.data(), p->grad.numel());
    return out;
  }
  model::optimizer& opt_;
  const start_point from_;
  train_batches batches_;
  const int64_t per_epoch_;
  const int64_t total_steps_;
  epoch_accumulator acc_;
  progress_reporter progress_;
  checkpoint_clock periodic_;
  tensor dlogits_;
  accumulated pending_;
  bool stop_ = false;
};

} // namespace

void set_losses(epoch_metrics& m, const accuracies& a) {
  m.test_loss = a.test_loss;
  m.validation_loss = a.validation_loss;
  m.perplexity = std::exp(a.test_loss);
  m.bits_per_char = a.test_loss / std::log(2.0);
  m.sample = a.sample;
}

history run_sequential(const job& j, std::ostream& log) {
  j.validate();
  const settings& s = j.config();
  if (traits(s.algo.kind).on_actors) throw error("run_sequential: algorithm " + std::string(to_string(s.algo.kind)) + " runs on actors");
  const auto start = std::chrono::steady_clock::now();
  // threads = 0: this process's share of the cores (Slurm's CPUs per task), not every core of the host.
  kernels::context ctx = kernels::context::with_threads(topology::local(s.threads).nodes[0].threads);
  ctx.gemm = s.gemm;
  const run_info info = info_of(j, ctx.threads);

  // Open the metrics file first, and try the checkpoint's: a bad path fails before minutes of training.
  const bool resuming = resumes(s);
  metrics_file metrics(s.metrics_out, resuming);
  net::check_checkpoint_writable(s.checkpoint);
  const loaded_data d = load_data(j, log);
  model::model net = build_model(j, d, resuming);
  std::unique_ptr<model::optimizer> opt = make_optimizer(s);
  const int64_t per_epoch = d.train_samples();
  const start_point from = resuming ? resume(s.checkpoint, net, *opt, d, per_epoch, log) : start_point{};
  log << "model " << j.model_name() << ": " << net.num_parameters() << " parameters, " << opt->describe() << ", "
      << ctx.threads << " threads";
  if (s.accumulate > 1)
    log << ", " << s.accumulate << " batches of " << s.batch_size << " per step (" << s.accumulate * s.batch_size
        << " samples)";
  log << "\n" << oversubscription_note(ctx.threads);
  if (from.epochs >= s.epochs) return {};

  sequential_epochs epochs(j, ctx, d, net, *opt, from, log);
  history out;
  for (int epoch = from.epochs; epoch < s.epochs; ++epoch) {
    const epoch_accumulator::verdict verdict = epochs.train(epoch);
    const epoch_metrics m = epochs.close(epoch, start);
    log << describe(m, info) << std::endl;
    metrics.write(m, info);
    out.push_back(m);
    if (epoch_callback(j, m) || verdict == epoch_accumulator::verdict::end_run) break;
  }
  return out;
}

int64_t log_resume(const std::string& path, int epochs, int64_t steps, int64_t epoch_samples,
                   int64_t samples_per_epoch, std::ostream& log) {
  log << "resumed from " << path << " after epoch " << epochs << " (" << steps << " steps)";
  if (epoch_samples >= samples_per_epoch) {
    log << "; its position inside epoch " << epochs + 1 << " (" << epoch_samples
        << " samples) is past this data set's end: that epoch starts over";
    epoch_samples = 0;
  } else if (epoch_samples > 0) {
    log << ", " << epoch_samples << " samples into epoch " << epochs + 1;
  }
  log << "\n";
  return epoch_samples;
}

} // namespace troupe::train
