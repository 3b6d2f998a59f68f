// One data loader, one worker and one parameter shard (ASGD) as CAF-free
// cores, for the benchmarks that call them in turn on one thread.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "actors/loader_core.hpp"
#include "actors/shard_core.hpp"
#include "actors/worker_core.hpp"
#include "train/loop.hpp"
#include "train/plan.hpp"

namespace troupe::bench {

class one_of_each {
public:
  /// The cores of `j` (an asgd job with one worker) over `d`, with `threads` kernel threads.
  one_of_each(const job& j, const train::loaded_data& d, int threads) {
    const shape sample = d.sets.train.sample_shape();
    model::model init = j.build_model(sample);
    const model::param_layout layout = init.layout();
    plan_ = train::make_plan(j.config(), train::topology::local(threads), layout, d.sets.train.count);
    std::vector<named_tensor> ts;
    for (auto* p : init.parameters()) ts.push_back({p->name, p->value.clone()});
    shard_ = std::make_unique<actors::shard_core>(plan_.shards.at(0), ts, rule_config(j.config()),
                                                  j.config().schedule, plan_.total_updates,
                                                  kernels::context::with_threads(threads));
    loader_ = std::make_unique<actors::loader_core>(d.sets.train, d.norm, j.config().batch_size, plan_.loaders.at(0));
    auto pool = std::make_shared<actors::replica_pool>([j, sample] { return j.build_model(sample); });
    worker_ = std::make_unique<actors::worker_core>(
        plan_.workers.at(0), pool,
        actors::shard_weights({plan_.workers[0].address, plan_.shards, layout}));
    for (auto& pull : worker_->start()) answer(pull.msg);
  }

  /// One step as the actors take it: a batch, the worker's step, the shard's answer.
  void step() {
    auto out = worker_->step(loader_->next());
    for (auto& p : out.pushes) answer(p.msg);
  }

  /// The shard answers `m`; the worker takes the replies.
  void answer(const net::message& m) {
    for (auto& r : shard_->handle(m)) worker_->on_params(r.msg);
  }

  actors::shard_core& shard() { return *shard_; }
  actors::loader_core& loader() { return *loader_; }
  actors::worker_core& worker() { return *worker_; }

private:
  train::plan plan_;
  std::unique_ptr<actors::shard_core> shard_;
  std::unique_ptr<actors::loader_core> loader_;
  std::unique_ptr<actors::worker_core> worker_;
};

} // namespace troupe::bench
