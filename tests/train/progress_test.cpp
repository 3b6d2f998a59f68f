#include <catch2/catch.hpp>

#include <chrono>
#include <sstream>
#include <string>

#include "train/progress.hpp"

using namespace troupe;
using namespace troupe::train;
using Catch::Matchers::Contains;
using Catch::Matchers::Equals;

namespace {

// A clock the test moves by hand.
struct fake_clock {
  std::chrono::steady_clock::time_point now{};
  void at(double s) { now = std::chrono::steady_clock::time_point{} + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s)); }
};

progress_options on(fake_clock& c) {
  progress_options o;
  o.clock = [&c] { return c.now; };
  return o;
}

// The caller's figures for an epoch that began at `begin` (caller time) and
// trained `done` batches of 64 by `t`: its rate counts from the epoch's start.
double rate_since_start(int64_t done, double begin, double t) { return 64.0 * static_cast<double>(done) / (t - begin); }

} // namespace

TEST_CASE("progress lines: the first comes after the first step, its rate measured from that step", "[progress]") {
  fake_clock c;
  std::ostringstream log;
  progress_reporter p(log, progress_mode::lines, on(c));
  // 10 s of start-up; the epoch's clock started at 7 s, and its first step
  // (slow: warming up) ended at 10 s; then 100 batches/s, 6400 samples/s.
  c.at(10);
  p.update(1, 5, 1, 1876, 2.3, rate_since_start(1, 7, 10));
  c.at(15);
  p.update(1, 5, 501, 1876, 0.9, rate_since_start(501, 7, 15));
  CHECK(log.str().empty());  // the first line comes 10 s after the first step, not after start-up
  c.at(20);
  p.update(1, 5, 1001, 1876, 0.8, rate_since_start(1001, 7, 20));
  CHECK_THAT(log.str(), Equals("epoch 1/5: 1001/1876 batches, loss 0.8000, 6400 samples/s\n"));
}

TEST_CASE("progress lines: an epoch's first line shows no rate until the epoch has run a while", "[progress]") {
  fake_clock c;
  std::ostringstream log;
  progress_reporter p(log, progress_mode::lines, on(c));
  c.at(0);
  p.update(1, 5, 1, 1876, 2.3, rate_since_start(1, -0.01, 0));
  c.at(10.4);
  p.update(1, 5, 1041, 1876, 0.8, rate_since_start(1041, -0.01, 10.4));
  // Epoch 2 began at 20 s (caller time); its clock runs through the evaluation
  // of epoch 1, and its first step ended at 21.5 s, more than 10 s after the last line.
  c.at(21.5);
  p.update(2, 5, 7, 1876, 0.5, rate_since_start(7, 20, 21.5));
  c.at(32);
  p.update(2, 5, 1057, 1876, 0.4, rate_since_start(1057, 20, 32));
  std::istringstream lines(log.str());
  std::string first, second, third;
  std::getline(lines, first);
  std::getline(lines, second);
  std::getline(lines, third);
  CHECK_THAT(first, Equals("epoch 1/5: 1041/1876 batches, loss 0.8000, 6400 samples/s"));
  CHECK_THAT(second, Equals("epoch 2/5: 7/1876 batches, loss 0.5000"));  // 7 batches: no rate yet
  // Measured from the first step's end: the evaluation before it does not count.
  CHECK_THAT(third, Equals("epoch 2/5: 1057/1876 batches, loss 0.4000, 6400 samples/s"));
}

TEST_CASE("progress bar: drawn at the first step without a rate, the rate once known", "[progress]") {
  fake_clock c;
  std::ostringstream log;
  progress_reporter p(log, progress_mode::bar, on(c));
  c.at(5);
  p.update(1, 2, 1, 10, 1.0, rate_since_start(1, 2, 5));
  CHECK_THAT(log.str(), Contains("epoch 1/2 ["));
  CHECK_THAT(log.str(), !Contains("samples/s"));
  c.at(5.1);
  p.update(1, 2, 2, 10, 1.0, rate_since_start(2, 2, 5.1));  // within 0.2 s: not drawn again
  const std::size_t drawn = log.str().size();
  c.at(8);
  p.update(1, 2, 301, 1000, 0.5, rate_since_start(301, 2, 8));
  CHECK(log.str().size() > drawn);
  CHECK_THAT(log.str().substr(drawn), Contains("6400 samples/s"));
  p.finish_line();
  CHECK(log.str().back() == '\n');
}

TEST_CASE("progress none prints nothing", "[progress]") {
  fake_clock c;
  std::ostringstream log;
  progress_reporter p(log, progress_mode::none, on(c));
  for (int i = 0; i < 5; ++i) {
    c.at(20.0 * i);
    p.update(1, 1, i, 4, 1.0, 100);
  }
  p.finish_line();
  CHECK(log.str().empty());
}
