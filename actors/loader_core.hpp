#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "data/dataset.hpp"
#include "net/message.hpp"
#include "train/loop.hpp"
#include "train/plan.hpp"
#include "train/trace.hpp"

namespace troupe::actors {

/// A data loader: its part [begin, end) of the training set, reshuffled every
/// epoch from (seed, epoch); makes Batch messages for its worker without end
/// (the epochs roll over), so that the coordinator alone decides when training
/// stops. Each batch is made straight into its message. A language model's
/// loader draws end - begin random windows of the training text per epoch
/// (from (seed, epoch), as the sequential loop does), with a next token per
/// position as labels.
class loader_core {
public:
  /// `ds` must outlive the loader.
  loader_core(const data::image_dataset& ds, const data::normalization& norm, int64_t batch_size,
              const train::loader_plan& p, int first_epoch = 0);
  /// A language model's loader; `text` must outlive it.
  loader_core(const train::text_data& text, int64_t batch_size, const train::loader_plan& p, int first_epoch = 0);
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
  int64_t batches_per_epoch() const;
  const net::address& address() const { return p_.address; }
  const net::address& worker() const { return p_.worker; }

private:
  void start_epoch();
  int64_t next_size() const;
  /// Fills `batch` of `msg` (next_size() samples): its images straight into the message, outside
  /// its segments when large (net::written_blob), kept in `keep`.
  void fill(capnp::MessageBuilder& msg, wire::Batch::Builder batch, std::shared_ptr<const void>& keep);

  std::optional<data::batcher> batches_;  // images
  data::batch tmp_;  // its images view the message being built while next() fills it
  const train::text_data* text_ = nullptr;  // or text
  std::optional<data::window_sampler> windows_;
  data::text_batch windows_batch_;
  int64_t drawn_ = 0;  // windows drawn in this epoch
  int64_t batch_size_ = 0;
  shape sample_;
  train::loader_plan p_;
  std::shared_ptr<train::tracer> trace_;
  std::string track_;
  int epoch_ = 0;
  uint64_t index_ = 0;
};

} // namespace troupe::actors
