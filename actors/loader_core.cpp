#include "actors/loader_core.hpp"

#include <algorithm>

#include "net/tensor_codec.hpp"

namespace troupe::actors {

loader_core::loader_core(const data::image_dataset& ds, const data::normalization& norm, int64_t batch_size,
                         const train::loader_plan& p, int first_epoch)
    : batches_(ds, batch_size, norm, p.seed, true, p.begin, p.end), sample_(ds.sample_shape()), p_(p),
      epoch_(first_epoch) {
  batches_.start_epoch(epoch_);
}

void loader_core::restart(int epoch) {
  if (epoch == epoch_) return;
  epoch_ = epoch;
  batches_.start_epoch(epoch_);
}

int64_t loader_core::skip_trained(int64_t epoch_samples, int64_t samples_per_epoch) {
  if (epoch_samples <= 0 || samples_per_epoch <= 0) return 0;
  const int64_t part = p_.end - p_.begin;
  const int64_t share = std::min(epoch_samples, samples_per_epoch) * part / samples_per_epoch;
  int64_t skipped = 0;
  data::batch b;
  while (skipped < share && batches_.next(b)) skipped += b.size();
  return skipped;
}

net::message loader_core::next() {
  train::trace_span span(trace_.get(), track_, "load");
  if (batches_.next_size() == 0) {
    batches_.start_epoch(++epoch_);
    if (batches_.next_size() == 0) throw error(net::to_string(p_.address) + ": its part of the data is empty");
  }
  std::vector<int64_t> dims{batches_.next_size()};
  dims.insert(dims.end(), sample_.dims().begin(), sample_.dims().end());
  const shape s(dims);
  auto b = net::make_builder(s.numel() * sizeof(float) + s[0] * 4);
  auto batch = net::init_envelope(*b, p_.address, p_.worker).initBatch();
  batch.setEpoch(static_cast<uint32_t>(epoch_));
  batch.setIndex(index_++);
  tmp_.images = tensor::wrap(s, net::init_tensor(s, batch.initImages()));
  const bool made = batches_.next(tmp_);
  tmp_.images = tensor();
  if (!made) throw error(net::to_string(p_.address) + ": no batch where one was due");
  auto labels = batch.initLabels(static_cast<unsigned>(tmp_.labels.size()));
  for (unsigned i = 0; i < labels.size(); ++i) labels.set(i, tmp_.labels[i]);
  return net::message::from_builder(std::move(b));
}

} // namespace troupe::actors
