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

#include "actors/ps_core.hpp"
#include "kernels/kernels.hpp"
#include "samples/train_loop.hpp"

using namespace troupe;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

} // namespace

int main(int argc, char** argv) {
  train::options o;
  o.model = "mlp";
  int rounds = 40;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--model") o.model = v;
    else if (a == "--rounds") rounds = std::stoi(v);
    else {
      std::cerr << "unknown option " << a << "\n";
      return 2;
    }
  }
  try {
    std::ostringstream log;
    const kernels::context ctx = kernels::context::all_cores();
    train::run_data data = train::load_data(o, log);
    const auto& ds = data.sets.train;
    auto fresh = [&] { return train::build_model(o, ds); };
    const float lr = 0.05f;
    // The sequential loop.
    model::model seq = fresh();
    data::batcher batches(ds, o.batch_size, data.norm, o.seed, true);
    batches.start_epoch(0);
    data::batch batch;
    tensor dlogits;
    // The cores of 1 loader, 1 worker, 1 shard.
    std::vector<named_tensor> ts;
    std::vector<int64_t> sizes;
    for (auto* p : seq.parameters()) {
      ts.push_back({p->name, p->value.clone()});
      sizes.push_back(p->value.numel());
    }
    model::update_config rc;
    rc.rule = "asgd";
    rc.lr = lr;
    actors::shard_core shard(0, ts, rc, "constant", 1, {}, ctx);
    actors::loader_core loader(ds, data.norm, o.batch_size, o.seed, 0, ds.count, 0);
    actors::worker_config wc;
    wc.threads = ctx.threads;
    actors::worker_core worker(std::make_shared<actors::replica_pool>(fresh), actors::plan_shards(sizes, 1), wc);
    for (auto& pull : worker.pull())
      for (auto& r : shard.handle(pull)) worker.on_params(r.second);

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
        net::message m = loader.next();
        const double b = now();
        auto out = worker.step(m);
        const double c = now();
        std::vector<std::pair<uint32_t, net::message>> replies;
        for (auto& [s, push] : out.pushes) replies = shard.handle(push);
        out.pushes.clear();
        const double d = now();
        for (auto& r : replies) worker.on_params(r.second);
        const double e = now();
        if (count) t[3] += b - a, t[4] += c - b, t[5] += d - c, t[6] += e - d;
      }
    }
    const double us = 1e6 / ((rounds - warm) * per_round);
    const double seq_total = (t[0] + t[1] + t[2]) * us, cores_total = (t[3] + t[4] + t[5] + t[6]) * us;
    std::printf("%s, per step, %d steps of each interleaved, %d kernel threads\n", o.model.c_str(),
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
