// Where the actor path's time goes, phase by phase, without CAF: the
// sequential loop's step (make a batch, forward + backward, SGD) against the
// parameter-server cores' step (loader builds a Batch message, worker step,
// shard answers the push, worker validates the Params), interleaved in one
// process, 25 steps of each in turn. Plain SGD, lr 0.05, ASGD, batch 64.
//
//   build/bench/troupe_actor_phases [--model mlp|cnn] [--rounds R]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>

#include "bench/one_of_each.hpp"
#include "kernels/kernels.hpp"
#include "model/zoo.hpp"

using namespace troupe;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

} // namespace

int main(int argc, char** argv) {
  std::string model = "mlp";
  int rounds = 40;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--model") model = v;
    else if (a == "--rounds") rounds = std::stoi(v);
    else {
      std::cerr << "unknown option " << a << "\n";
      return 2;
    }
  }
  try {
    std::ostringstream log;
    const kernels::context ctx = kernels::context::all_cores();
    const float lr = 0.05f;
    const job j = job()
                      .model([model] { return zoo::by_name(model); }, model)
                      .data(data::fashion_mnist())
                      .algorithm(asgd())
                      .lr(lr)
                      .schedule(lr_schedule::constant)
                      .threads(ctx.threads);
    const train::loaded_data data = train::load_data(j, log);
    const auto& ds = data.sets.train;
    const int64_t batch_size = j.config().batch_size;
    // The sequential loop.
    model::model seq = j.build_model(ds.sample_shape());
    data::batcher batches(ds, batch_size, data.norm, j.config().seed, true);
    batches.start_epoch(0);
    data::batch batch;
    tensor dlogits;
    // The cores of 1 loader, 1 worker, 1 shard.
    bench::one_of_each cores(j, data, ctx.threads);

    const int per_round = 25, warm = 2;
    double t[7] = {0};
    for (int round = 0; round < rounds; ++round) {
      const bool count = round >= warm;
      for (int i = 0; i < per_round; ++i) {
        const double a = now();
        if (!batches.next(batch)) {
          batches.start_epoch(round + 1);
          batches.next(batch);
        }
        const double b = now();
        kernels::softmax_cross_entropy(ctx, seq.forward(ctx, batch.images, true), batch.labels, &dlogits);
        seq.backward(ctx, dlogits);
        const double c = now();
        for (auto* p : seq.parameters()) kernels::sgd_step(ctx, p->value, p->grad, lr, 0.0f);
        const double d = now();
        if (count) t[0] += b - a, t[1] += c - b, t[2] += d - c;
      }
      for (int i = 0; i < per_round; ++i) {
        const double a = now();
        net::message m = cores.loader().next();
        const double b = now();
        auto out = cores.worker().step(m);
        const double c = now();
        std::vector<actors::shard_core::reply> replies;
        for (auto& p : out.pushes) replies = cores.shard().handle(p.msg);
        out.pushes.clear();
        const double d = now();
        for (auto& r : replies) cores.worker().on_params(r.msg);
        const double e = now();
        if (count) t[3] += b - a, t[4] += c - b, t[5] += d - c, t[6] += e - d;
      }
    }
    const double us = 1e6 / ((rounds - warm) * per_round);
    const double seq_total = (t[0] + t[1] + t[2]) * us, cores_total = (t[3] + t[4] + t[5] + t[6]) * us;
    std::printf("%s, per step, %d steps of each interleaved, %d kernel threads\n", model.c_str(),
                (rounds - warm) * per_round, ctx.threads);
    std::printf("  sequential:  batch %.1f us, forward+backward %.1f us, SGD %.1f us; total %.1f us\n", t[0] * us,
                t[1] * us, t[2] * us, seq_total);
    std::printf("  cores:       loader %.1f us, worker step %.1f us, shard (validate, update, reply) %.1f us, "
                "worker validates the Params %.1f us; total %.1f us\n",
                t[3] * us, t[4] * us, t[5] * us, t[6] * us, cores_total);
    std::printf("  ratio (sequential / cores time): %.3f\n", seq_total / cores_total);
  } catch (const std::exception& e) {
    std::cerr << "troupe_actor_phases: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
