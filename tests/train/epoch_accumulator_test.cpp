// The epoch accumulator: workers' reports summed into epochs; when an epoch
// and the run end; partial epochs; stops; resumed runs. Time points are
// made by hand: nothing is timed.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "train/epoch_accumulator.hpp"

using namespace troupe;
using namespace troupe::train;
using verdict = epoch_accumulator::verdict;
using std::chrono::seconds;

namespace {

const epoch_accumulator::time_point t0 = epoch_accumulator::time_point{} + seconds(100);

step_report report(uint32_t worker, uint64_t samples, double loss, double tau = 0, uint32_t max_tau = 0,
                   uint32_t rejected = 0) {
  step_report r;
  r.worker = worker;
  r.samples = samples;
  r.loss = loss;
  r.mean_staleness = tau;
  r.max_staleness = max_tau;
  r.rejected = rejected;
  return r;
}

epoch_accumulator::limits limits_of(int64_t samples_per_epoch, int epochs, int workers = 2) {
  epoch_accumulator::limits l;
  l.samples_per_epoch = samples_per_epoch;
  l.batches_per_epoch = samples_per_epoch / 4;
  l.epochs = epochs;
  l.workers = workers;
  return l;
}

} // namespace

TEST_CASE("epoch accumulator: epochs end by samples, the run at the last epoch", "[train][epochs]") {
  epoch_accumulator acc(limits_of(10, 2), t0);
  CHECK(acc.epoch() == 0);
  CHECK(acc.steps() == 0);
  CHECK(acc.add(report(0, 4, 1.0, 1.0, 2)) == verdict::train_on);
  CHECK(acc.add(report(1, 4, 2.0, 0.0, 0, 1)) == verdict::train_on);
  CHECK(acc.batches_done(4) == 2);
  CHECK(acc.mean_loss() == Approx(1.5));
  CHECK(acc.samples_per_s(t0 + seconds(4)) == Approx(2.0));  // 8 samples in 4 s
  CHECK(acc.add(report(0, 4, 3.0, 2.0, 5, 1)) == verdict::end_epoch);  // 12 >= 10
  CHECK_FALSE(acc.stopped());

  const epoch_metrics m = acc.close_epoch(0.05, t0 + seconds(6));
  CHECK(m.epoch == 1);
  CHECK(m.steps == 3);
  CHECK(m.train_loss == Approx(2.0));          // (1 + 2 + 3) / 3
  CHECK(m.mean_staleness == Approx(1.0));      // (1 + 0 + 2) / 3
  CHECK(m.max_staleness == 5);
  CHECK(m.rejected == 2);
  CHECK(m.lr == Approx(0.05));
  CHECK(m.train_s == Approx(6.0));
  CHECK(m.samples_per_s == Approx(2.0));  // 12 samples in 6 s
  CHECK(acc.last_closed_complete());
  CHECK(acc.epoch() == 1);
  // The next epoch starts from nothing.
  CHECK(acc.mean_loss() == 0.0);
  CHECK(acc.batches_done(4) == 0);

  CHECK(acc.add(report(1, 6, 1.0)) == verdict::train_on);
  CHECK(acc.add(report(0, 4, 0.5)) == verdict::end_run);  // the last epoch is full
  CHECK(acc.stopped());
  // Reports after the end (steps that finished after the stop) are ignored.
  CHECK(acc.add(report(1, 100, 50.0, 9, 9, 9)) == verdict::end_run);
  CHECK(acc.steps() == 5);
  const epoch_metrics last = acc.close_epoch(0.01, t0 + seconds(8));
  CHECK(last.epoch == 2);
  CHECK(last.steps == 5);
  CHECK(last.train_loss == Approx(0.75));
  CHECK(last.mean_staleness == 0.0);
  CHECK(last.max_staleness == 0);
  CHECK(last.rejected == 0);
  CHECK(last.train_s == Approx(2.0));
  CHECK(acc.last_closed_complete());
  // Samples per worker over the whole run: 4 + 4 + 4 and 4 + 6.
  CHECK(acc.worker_samples() == std::vector<uint64_t>{12, 10});
}

TEST_CASE("epoch accumulator: max_steps ends the run inside an epoch: a partial epoch", "[train][epochs]") {
  epoch_accumulator::limits l = limits_of(100, 3);
  l.max_steps = 2;
  epoch_accumulator acc(l, t0);
  CHECK(acc.add(report(0, 4, 1.0)) == verdict::train_on);
  CHECK(acc.add(report(1, 4, 1.0)) == verdict::end_run);
  const epoch_metrics m = acc.close_epoch(0.1, t0 + seconds(1));
  CHECK(m.epoch == 1);
  CHECK(m.steps == 2);
  CHECK_FALSE(acc.last_closed_complete());
  // max_steps also ends a run at an epoch's last step.
  epoch_accumulator exact(l, t0);
  exact.add(report(0, 50, 1.0));
  CHECK(exact.add(report(0, 50, 1.0)) == verdict::end_run);
  exact.close_epoch(0.1, t0);
  CHECK(exact.last_closed_complete());
}

TEST_CASE("epoch accumulator: request_stop ends the run at the next report", "[train][epochs]") {
  epoch_accumulator acc(limits_of(100, 5), t0);
  CHECK(acc.add(report(0, 4, 1.0)) == verdict::train_on);
  acc.request_stop();
  CHECK_FALSE(acc.stopped());
  CHECK(acc.add(report(1, 4, 3.0)) == verdict::end_run);
  CHECK(acc.stopped());
  const epoch_metrics m = acc.close_epoch(0.1, t0 + seconds(1));
  CHECK(m.steps == 2);
  CHECK(m.train_loss == Approx(2.0));
  CHECK_FALSE(acc.last_closed_complete());
}

TEST_CASE("epoch accumulator: a resumed run counts on from its first epoch and steps", "[train][epochs]") {
  epoch_accumulator::limits l = limits_of(8, 5);
  l.first_epoch = 3;
  l.first_steps = 100;
  l.max_steps = 103;
  epoch_accumulator acc(l, t0);
  CHECK(acc.epoch() == 3);
  CHECK(acc.steps() == 100);
  CHECK(acc.add(report(0, 8, 1.0)) == verdict::end_epoch);
  const epoch_metrics m = acc.close_epoch(0.1, t0 + seconds(1));
  CHECK(m.epoch == 4);
  CHECK(m.steps == 101);
  // Epoch 5 of 5 is the last: the run ends when it is full...
  CHECK(acc.add(report(1, 4, 1.0)) == verdict::train_on);
  CHECK(acc.add(report(1, 4, 1.0)) == verdict::end_run);
  CHECK(acc.close_epoch(0.1, t0 + seconds(2)).epoch == 5);
  // ...and max_steps counts the steps before the resume.
  epoch_accumulator cut(l, t0);
  cut.add(report(0, 1, 1.0));
  cut.add(report(0, 1, 1.0));
  CHECK(cut.add(report(0, 1, 1.0)) == verdict::end_run);  // step 103
  CHECK(cut.steps() == 103);
  // A report from an unknown worker is summed but not counted per worker.
  epoch_accumulator one(limits_of(8, 1, 1), t0);
  CHECK(one.add(report(7, 4, 1.0)) == verdict::train_on);
  CHECK(one.worker_samples() == std::vector<uint64_t>{0});
  CHECK(one.batches_done(4) == 1);
}

// Bug (issue 21, item 18): a run resumed from a checkpoint inside an epoch
// counted that epoch's samples from 0, so the epoch recorded its steps before
// the checkpoint twice.
TEST_CASE("epoch accumulator: a run resumed inside an epoch trains the rest of it only", "[train][epochs]") {
  epoch_accumulator::limits l = limits_of(40, 2, 1);  // 10 steps of 4 samples per epoch
  l.first_epoch = 0;
  l.first_steps = 3;
  l.first_epoch_samples = 12;  // 3 steps into epoch 1
  epoch_accumulator acc(l, t0);
  CHECK(acc.epoch_samples() == 12);
  CHECK(acc.batches_done(4) == 3);
  for (int i = 0; i < 6; ++i) CHECK(acc.add(report(0, 4, 1.0)) == verdict::train_on);
  CHECK(acc.add(report(0, 4, 1.0)) == verdict::end_epoch);  // the 10th step of the epoch
  const epoch_metrics m = acc.close_epoch(0.1, t0 + seconds(2));
  CHECK(m.epoch == 1);
  CHECK(m.steps == 10);
  CHECK(m.samples_per_s == Approx(28.0 / 2));  // the samples trained since the resume
  CHECK(acc.last_closed_complete());
  // The next epoch is whole.
  CHECK(acc.epoch_samples() == 0);
  for (int i = 0; i < 9; ++i) CHECK(acc.add(report(0, 4, 1.0)) == verdict::train_on);
  CHECK(acc.add(report(0, 4, 1.0)) == verdict::end_run);
  CHECK(acc.close_epoch(0.1, t0 + seconds(4)).steps == 20);
}

TEST_CASE("epoch accumulator: a hybrid stage's staleness-only report counts its staleness, not a step",
          "[train][epochs]") {
  epoch_accumulator acc(limits_of(8, 1, 1), t0);
  CHECK(acc.add(report(0, 4, 1.0, 1.0, 1)) == verdict::train_on);  // the last stage's step, its push at 1
  step_report earlier = report(0, 0, 0.0, 3.0, 4, 1);              // a stage before it: pushes at 3 and 4
  earlier.staleness_only = true;
  acc.add_staleness(earlier);
  CHECK(acc.steps() == 1);
  CHECK(acc.batches_done(4) == 1);
  CHECK(acc.mean_loss() == Approx(1.0));
  const std::vector<worker_summary> w = acc.worker_summaries();
  REQUIRE(w.size() == 1);
  CHECK(w[0].updates == 2);
  CHECK(w[0].samples == 4);
  CHECK(w[0].mean_staleness == Approx(2.0));
  CHECK(w[0].max_staleness == 4);
  CHECK(w[0].compute_s == 0);  // none reported: not measured
  CHECK(acc.add(report(0, 4, 3.0)) == verdict::end_run);
  acc.add_staleness(earlier);  // after the run's end: ignored
  const epoch_metrics m = acc.close_epoch(0.1, t0 + seconds(2));
  CHECK(m.steps == 2);
  CHECK(m.train_loss == Approx(2.0));
  CHECK(m.mean_staleness == Approx(4.0 / 3.0));  // (1 + 3 + 0) / 3 reports with staleness
  CHECK(m.max_staleness == 4);
  CHECK(m.rejected == 1);
}

TEST_CASE("epoch accumulator: each worker's updates and staleness over the run", "[train][epochs]") {
  epoch_accumulator acc(limits_of(1000, 1, 3), t0);
  // Worker 0: staleness 1, 2, 2, 3, 10 (max over shards 12 once); worker 1: 0.4 and 0.6 round to 0 and 1;
  // worker 2 reports nothing.
  for (double tau : {1.0, 2.0, 2.0, 3.0}) acc.add(report(0, 4, 0.5, tau, static_cast<uint32_t>(tau)));
  acc.add(report(0, 4, 0.5, 10.0, 12));
  acc.add(report(1, 8, 0.5, 0.4, 1));
  acc.add(report(1, 8, 0.5, 0.6, 1));
  const auto w = acc.worker_summaries();
  REQUIRE(w.size() == 3);
  CHECK(w[0].worker == 0);
  CHECK(w[0].samples == 20);
  CHECK(w[0].updates == 5);
  CHECK(w[0].mean_staleness == Approx(18.0 / 5));
  CHECK(w[0].median_staleness == 2);
  CHECK(w[0].p90_staleness == 10);
  CHECK(w[0].max_staleness == 12);
  CHECK(w[1].updates == 2);
  CHECK(w[1].mean_staleness == Approx(0.5));
  CHECK(w[1].median_staleness == 0);
  CHECK(w[1].p90_staleness == 1);
  CHECK(w[2].updates == 0);
  CHECK(w[2].mean_staleness == 0);
  CHECK(w[2].max_staleness == 0);
  // The summary survives the epochs closing.
  acc.close_epoch(0.1, t0 + seconds(1));
  CHECK(acc.worker_summaries()[0].updates == 5);
}

TEST_CASE("epoch accumulator: each worker's compute time over the run, in the summary's record",
          "[train][epochs]") {
  epoch_accumulator acc(limits_of(1000, 1, 2), t0);
  for (double c : {0.010, 0.030}) {
    step_report r = report(0, 64, 1.0);
    r.compute_s = c;
    acc.add(r);
  }
  step_report other = report(1, 64, 1.0);
  other.compute_s = 0.005;
  acc.add(other);
  step_report staleness = report(1, 0, 0.0, 2.0, 2);
  staleness.staleness_only = true;
  staleness.compute_s = 1.0;  // a staleness-only report is no step: its time is not counted
  acc.add_staleness(staleness);
  const std::vector<worker_summary> w = acc.worker_summaries();
  REQUIRE(w.size() == 2);
  CHECK(w[0].compute_s == Approx(0.040));
  CHECK(w[1].compute_s == Approx(0.005));
  run_info info;
  info.batch_size = 64;
  const auto j = nlohmann::json::parse(to_json(w, info))["workers_summary"];
  CHECK(j[0]["compute_s"].get<double>() == Approx(0.04));
  CHECK(j[0]["compute_ms_per_step"].get<double>() == Approx(20.0));  // 40 ms over 2 steps of 64
  CHECK(j[1]["compute_ms_per_step"].get<double>() == Approx(5.0));
  CHECK_FALSE(nlohmann::json::parse(to_json(std::vector<worker_summary>{worker_summary{}}, info))["workers_summary"][0]
                  .contains("compute_s"));  // not measured: left out
  // The log's line: 5-20 ms a step, busy 1-8 % of 0.5 s.
  CHECK(describe_compute(w, info, 0.5) ==
        "compute per worker (forward, backward, hand-off, as it ran): 5.00-20.00 ms a step, busy 1-8 % of the 0.5 s "
        "of training (the rest waiting for the network or the cores)");
  CHECK(describe_compute(std::vector<worker_summary>{worker_summary{}}, info, 0.5).empty());
}
