#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "data/dataset.hpp"
#include "net/message.hpp"
#include "train/plan.hpp"
#include "train/trace.hpp"

namespace troupe::actors {

/// A data loader: its part [begin, end) of the training set, reshuffled every
/// epoch from (seed, epoch); makes Batch messages for its worker without end
/// (the epochs roll over), so that the coordinator alone decides when training
/// stops. Each batch is made straight into its message.
class loader_core {
public:
  /// `ds` must outlive the loader.
  loader_core(const data::image_dataset& ds, const data::normalization& norm, int64_t batch_size,
              const train::loader_plan& p, int first_epoch = 0);
  net::message next();
  /// The run's timeline: a span "load" per batch.
  void trace(std::shared_ptr<train::tracer> t) {
    trace_ = std::move(t);
    track_ = net::to_string(p_.address);
  }
  /// Goes on at the start of epoch `epoch` (a worker that joins a running
  /// job); nothing changes when the loader is in that epoch already.
  void restart(int epoch);
  /// A run resumed inside an epoch, `epoch_samples` of its `samples_per_epoch`
  /// trained already: skips this loader's share of them (its part's fraction,
  /// rounded up to whole batches), so that the epoch trains the rest. With one
  /// loader this is exact. With several, asynchronous workers did not train at
  /// one pace, so their loaders were not equally far: each skips the same
  /// fraction of its part, and the samples skipped are close to, not exactly,
  /// those trained. Returns the samples skipped.
  int64_t skip_trained(int64_t epoch_samples, int64_t samples_per_epoch);
  int epoch() const { return epoch_; }
  int64_t batches_per_epoch() const { return batches_.batches_per_epoch(); }
  const net::address& address() const { return p_.address; }
  const net::address& worker() const { return p_.worker; }

private:
  data::batcher batches_;
  data::batch tmp_;  // its images view the message being built while next() fills it
  shape sample_;
  train::loader_plan p_;
  std::shared_ptr<train::tracer> trace_;
  std::string track_;
  int epoch_ = 0;
  uint64_t index_ = 0;
};

} // namespace troupe::actors
