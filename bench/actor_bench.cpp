// Actor overhead and the cost of one message, measured in one invocation.
//
//  1. Overhead: the sequential loop against 1 worker + 1 shard + 1 loader on
//     actors (ASGD), same model, data, seed, plain SGD (momentum 0, constant
//     lr), so both compute the same thing; interleaved repetitions, medians.
//  2. Per message: a shard answering a push of the model's size in place, and
//     with a copy (while a worker holds its last Params); validating a Params
//     message (limits, NaN scan) and reading it in place; and a CAF round trip
//     of a ref-counted message between two actors (nothing copied).
//
//  3. With --link-points FILE, only the link between two pipeline stages of
//     one process, for the placer's cost model: an Activation of 152 B to
//     100 MiB built as a stage builds it (the payload copied in), carried by
//     CAF to another actor that opens it as a stage does (limits, NaN scan),
//     and echoed back. One way = the round trip less half the round trip of
//     the smallest message (whose two hops it is). Writes "bytes seconds"
//     lines for troupe_placement_study --fit-link.
//
//   build/bench/troupe_actor_bench [--model mlp|cnn|both] [--steps N] [--reps R] [--threads T]
//   build/bench/troupe_actor_bench --link-points FILE [--reps R]
#include <caf/all.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "actors/directory.hpp"
#include "actors/fit.hpp"
#include "actors/messages.hpp"
#include "bench/one_of_each.hpp"
#include "model/zoo.hpp"
#include "net/tensor_codec.hpp"

using namespace troupe;
using clock_type = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

/// samples/s of one run in a forked child: each run starts, like the trainer
/// binary, without OpenMP teams or scheduler threads left by an earlier run
/// (run back to back in one process, the actor run measured 0.31 instead of ~0.5).
double in_fresh_process(const std::function<double()>& run) {
  std::cout.flush();  // else the child's exit would print the parent's buffered lines again
  int fd[2];
  if (::pipe(fd) != 0) throw std::runtime_error("pipe failed");
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fd[0]);
    double v = -1;
    try {
      v = run();
    } catch (const std::exception& e) {
      std::cerr << "run failed: " << e.what() << "\n";
    }
    if (::write(fd[1], &v, sizeof v) != sizeof v) ::_exit(1);
    ::_exit(0);
  }
  ::close(fd[1]);
  double v = -1;
  if (::read(fd[0], &v, sizeof v) != sizeof v) v = -1;
  ::close(fd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (v < 0) throw std::runtime_error("a measured run failed");
  return v;
}

/// The benchmark's job: `model` on Fashion-MNIST, plain SGD (momentum 0,
/// constant lr), no evaluation, `steps` steps.
job bench_job(const std::string& model, int64_t steps, int threads, algorithm a) {
  return job()
      .model([model] { return zoo::by_name(model); }, model)
      .data(data::fashion_mnist())
      .algorithm(a)
      .epochs(1)
      .lr(0.05f)
      .momentum(0)
      .schedule(lr_schedule::constant)
      .max_steps(steps)
      .threads(threads)
      .progress(progress_mode::none)
      .evaluate(false);
}

double trained(const job& j) {
  std::ostringstream log;
  return fit(j, log).at(0).samples_per_s;
}

/// samples/s of the actor path's cores called in turn on one thread, without
/// CAF: loader, worker, shard and back, as the actors would. The gap to the
/// sequential loop is the cost of the messages; the gap to the actors is CAF's.
double cores_only(const job& j) {
  std::ostringstream log;
  const train::loaded_data d = train::load_data(j, log);
  bench::one_of_each cores(j, d, j.config().threads);
  for (int i = 0; i < 20; ++i) cores.step();
  const auto t0 = clock_type::now();
  for (int64_t i = 0; i < j.config().max_steps; ++i) cores.step();
  return static_cast<double>(j.config().max_steps * j.config().batch_size) / seconds_since(t0);
}

void overhead(const std::string& model, int64_t steps, int reps, int threads) {
  const job seq_job = bench_job(model, steps, threads, sequential_sgd());
  const job actor_job = bench_job(model, steps, threads, asgd());
  std::vector<double> seq, act, cores;
  for (int r = 0; r < reps; ++r) {
    seq.push_back(in_fresh_process([&] { return trained(seq_job); }));
    act.push_back(in_fresh_process([&] { return trained(actor_job); }));
    cores.push_back(in_fresh_process([&] { return cores_only(actor_job); }));
  }
  const double s = median(seq), a = median(act), c = median(cores);
  std::cout << std::fixed << std::setprecision(0) << model << ": sequential " << s << " samples/s, actors (1 worker, 1 shard, 1 loader) "
            << a << " samples/s, ratio " << std::setprecision(3) << a / s << "  (" << steps << " steps, " << reps
            << " interleaved reps, medians, " << threads << " threads)\n"
            << "  the same cores called in turn on one thread, without CAF: " << std::setprecision(0) << c
            << " samples/s, ratio " << std::setprecision(3) << c / s << "\n";
}

/// A PushGradient of zeros from worker 0 for all of shard `p`'s range, as workers build them.
net::message zero_push(const train::shard_plan& p, const model::param_layout& layout) {
  auto b = net::make_builder(p.range.numel() * sizeof(float));
  auto push = net::init_envelope(*b, {0, net::role::worker, 0}, p.address).initPushGradient();
  push.setShard(p.address.index);
  net::init_flat(push.initValues(), p.range.first, p.range.begin, layout.shapes(p.range.first, p.range.last));
  return net::message::from_builder(std::move(b));
}

void message_cost(const std::string& model_name, int reps) {
  model::model m = zoo::by_name(model_name);
  m.build({1, 28, 28}, 1);
  std::vector<named_tensor> ts;
  for (auto* p : m.parameters()) ts.push_back({p->name, p->value.clone()});
  const model::param_layout layout = m.layout();
  const int64_t n = layout.numel();
  const train::shard_plan sp{{0, net::role::shard, 0}, model::plan_shards(layout, 1).at(0), {{0, net::role::worker, 0}}};
  model::update_config c;
  c.workers = 1;
  actors::shard_core shard(sp, ts, c, lr_schedule::constant, 1, kernels::context::all_cores());
  const net::message push = zero_push(sp, layout);
  // An ASGD push answered: validated, applied, replied. In place when the
  // worker has let its last Params go; else the update goes to a copy.
  std::vector<double> in_place_us, copy_us, read_us;
  net::message params = shard.handle(actors::make_pull({0, net::role::worker, 0}, sp.address)).at(0).msg;
  for (int r = 0; r < reps; ++r) {
    auto t0 = clock_type::now();
    for (int i = 0; i < 20; ++i) {
      params = net::message();
      params = std::move(shard.handle(push).at(0).msg);
    }
    in_place_us.push_back(seconds_since(t0) / 20 * 1e6);
    t0 = clock_type::now();
    for (int i = 0; i < 20; ++i) params = std::move(shard.handle(push).at(0).msg);
    copy_us.push_back(seconds_since(t0) / 20 * 1e6);
    t0 = clock_type::now();
    float sink = 0;
    for (int i = 0; i < 20; ++i) {
      net::envelope_reader rd(params, net::peer_limits());
      sink += net::view(rd.root().getParams().getValues(), "p").data[0];
    }
    read_us.push_back(seconds_since(t0) / 20 * 1e6);
    if (sink == 12345.f) std::cout << "";
  }
  const double mb = n * 4.0 / 1e6;
  std::cout << std::fixed << std::setprecision(1) << model_name << " Params message (" << n << " floats, "
            << std::setprecision(2) << mb << " MB): a push answered in place " << std::setprecision(1)
            << median(in_place_us) << " us, with a copy (a worker still holds the last Params) " << median(copy_us)
            << " us; validate + read in place " << median(read_us) << " us (" << std::setprecision(2)
            << mb / median(read_us) * 1e3 << " GB/s)\n";
}

/// Round trips of one message between two actors: the cost of CAF's mailbox
/// for a ref-counted Cap'n Proto message (its size does not matter).
void caf_round_trip(int reps) {
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", size_t(2));
  caf::actor_system sys{cfg};
  auto echo = sys.spawn([](caf::event_based_actor* self) -> caf::behavior {
    return {[self](const net::message& m) { return m; }};
  });
  net::message m = actors::make_pull({0, net::role::worker, 0}, {0, net::role::shard, 0});
  std::vector<double> us;
  caf::scoped_actor self{sys};
  const int per_rep = 20000;
  for (int r = 0; r < reps; ++r) {
    auto t0 = clock_type::now();
    for (int i = 0; i < per_rep; ++i) self->request(echo, caf::infinite, m).receive([](const net::message&) {}, [](caf::error&) {});
    us.push_back(seconds_since(t0) / per_rep * 1e6);
  }
  std::cout << std::fixed << std::setprecision(2) << "CAF round trip of a net::message between two actors: "
            << median(us) << " us (request + reply, " << per_rep << " per rep, median of " << reps << ")\n";
  self->send_exit(echo, caf::exit_reason::user_shutdown);
}

/// The same-process link (3. above): writes the points to `path`.
void same_process_link(int reps, const std::string& path) {
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", size_t(2));
  caf::actor_system sys{cfg};
  auto next_stage = sys.spawn([](caf::event_based_actor*) -> caf::behavior {
    return {[](const net::message& m) {
      net::envelope_reader r(m, net::peer_limits());  // as stage_core::take opens an Activation
      return m;
    }};
  });
  caf::scoped_actor self{sys};
  const net::address from{0, net::role::stage, 0}, to{0, net::role::stage, 1};
  std::ofstream out(path);
  if (!out) throw error("cannot write " + path);
  double small_rt = 0;
  for (const int64_t floats : {int64_t(38), int64_t(1) << 18, int64_t(1) << 22, int64_t(25) << 20}) {
    const tensor t = tensor::full({floats}, 0.5f);
    const int per_rep = floats > (1 << 20) ? 8 : floats > 1000 ? 200 : 5000;
    std::vector<double> rt;
    for (int r = 0; r <= reps; ++r) {  // the first repetition warms up
      const auto t0 = clock_type::now();
      for (int i = 0; i < per_rep; ++i) {
        auto b = net::make_builder(static_cast<std::size_t>(floats) * sizeof(float));
        net::encode(t, net::init_envelope(*b, from, to).initActivation().initTensor());
        self->request(next_stage, caf::infinite, net::message::from_builder(std::move(b)))
            .receive([](const net::message&) {}, [](caf::error&) {});
      }
      if (r > 0) rt.push_back(seconds_since(t0) / per_rep);
    }
    const double round_trip = median(rt);
    if (small_rt == 0) small_rt = round_trip;
    const double one_way = round_trip - small_rt / 2;
    const int64_t bytes = floats * static_cast<int64_t>(sizeof(float));
    out << bytes << " " << std::setprecision(9) << one_way << "\n";
    std::cout << std::fixed << std::setprecision(1) << "same process, " << bytes << " B: one way " << one_way * 1e6
              << " us (round trip " << round_trip * 1e6 << " us, median of " << reps << ")\n";
  }
  self->send_exit(next_stage, caf::exit_reason::user_shutdown);
}

} // namespace

int main(int argc, char** argv) {
  std::string model = "both";
  int64_t steps = 400;
  int reps = 3, threads = 2;
  std::string link_points;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--model") model = v;
    else if (a == "--steps") steps = std::stoll(v);
    else if (a == "--reps") reps = std::stoi(v);
    else if (a == "--threads") threads = std::stoi(v);
    else if (a == "--link-points") link_points = v;
    else {
      std::cerr << "unknown option " << a << "\n";
      return 2;
    }
  }
  try {
    if (!link_points.empty()) {
      same_process_link(reps, link_points);
      return 0;
    }
    for (std::string mm : {"mlp", "cnn"}) {
      if (model != "both" && model != mm) continue;
      // In a child too: OpenMP threads started here would not survive the later forks.
      in_fresh_process([mm] {
        message_cost(mm, 5);
        std::cout.flush();
        return 0.0;
      });
      overhead(mm, mm == "cnn" ? steps / 4 : steps, reps, threads);
    }
    caf_round_trip(5);
  } catch (const std::exception& e) {
    std::cerr << "troupe_actor_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
