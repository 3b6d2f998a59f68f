#include "actors/loader_core.hpp"

#include <algorithm>

#include "net/tensor_codec.hpp"

namespace troupe::actors {

loader_core::loader_core(const data::image_dataset& ds, const data::normalization& norm, int64_t batch_size,
                         const train::loader_plan& p, int first_epoch)
    : batches_(std::in_place, ds, batch_size, norm, p.seed, true, p.begin, p.end), batch_size_(batch_size),
      sample_(ds.sample_shape()), p_(p), epoch_(first_epoch) {
  start_epoch();
}

loader_core::loader_core(const train::text_data& text, int64_t batch_size, const train::loader_plan& p,
                         int first_epoch)
    : text_(&text), batch_size_(batch_size), sample_({text.windows.context}), p_(p), epoch_(first_epoch) {
  if (batch_size < 1) throw error(net::to_string(p.address) + ": batch size must be at least 1");
  start_epoch();
}

void loader_core::start_epoch() {
  if (batches_) return batches_->start_epoch(epoch_);
  windows_.emplace(text_->corpus, text_->parts.train, text_->windows.context, data::epoch_seed(p_.seed, epoch_));
  drawn_ = 0;
}

int64_t loader_core::next_size() const {
  if (batches_) return batches_->next_size();
  return std::min(batch_size_, p_.end - p_.begin - drawn_);
}

int64_t loader_core::batches_per_epoch() const {
  if (batches_) return batches_->batches_per_epoch();
  return (p_.end - p_.begin + batch_size_ - 1) / batch_size_;
}

void loader_core::restart(int epoch) {
  if (epoch == epoch_) return;
  epoch_ = epoch;
  start_epoch();
}

int64_t loader_core::skip_trained(int64_t epoch_samples, int64_t samples_per_epoch) {
  if (epoch_samples <= 0 || samples_per_epoch <= 0) return 0;
  const int64_t part = p_.end - p_.begin;
  const int64_t share = std::min(epoch_samples, samples_per_epoch) * part / samples_per_epoch;
  int64_t skipped = 0;
  for (int64_t n = next_size(); skipped < share && n > 0; n = next_size()) {
    if (batches_) {
      batches_->next(tmp_);
    } else {
      windows_->sample(n, windows_batch_);
      drawn_ += n;
    }
    skipped += n;
  }
  tmp_ = data::batch();
  return skipped;
}

void loader_core::fill(capnp::MessageBuilder& msg, wire::Batch::Builder batch, std::shared_ptr<const void>& keep) {
  const int64_t n = next_size();
  std::vector<int64_t> dims{n};
  dims.insert(dims.end(), sample_.dims().begin(), sample_.dims().end());
  const shape s(dims);
  float* images = net::init_tensor(msg, s, batch.initImages(), keep);  // written whole below
  const std::vector<int32_t>* labels = &tmp_.labels;
  if (batches_) {
    tmp_.images = tensor::wrap(s, images);
    const bool made = batches_->next(tmp_);
    tmp_.images = tensor();
    if (!made) throw error(net::to_string(p_.address) + ": no batch where one was due");
  } else {
    windows_->sample(n, windows_batch_);
    drawn_ += n;
    std::copy(windows_batch_.inputs.data(), windows_batch_.inputs.data() + s.numel(), images);
    labels = &windows_batch_.targets;
  }
  auto l = batch.initLabels(static_cast<unsigned>(labels->size()));
  for (unsigned i = 0; i < l.size(); ++i) l.set(i, (*labels)[i]);
}

net::message loader_core::next() {
  train::trace_span span(trace_.get(), track_, "load");
  if (next_size() == 0) {
    ++epoch_;
    start_epoch();
    if (next_size() == 0) throw error(net::to_string(p_.address) + ": its part of the data is empty");
  }
  const int64_t n = next_size();
  const int64_t labels = text_ ? n * text_->windows.context : n;
  const auto images = static_cast<std::size_t>(n * sample_.numel()) * sizeof(float);
  auto b = net::make_builder(net::written_inline_bytes(images) + static_cast<std::size_t>(labels) * 4);
  auto batch = net::init_envelope(*b, p_.address, p_.worker).initBatch();
  batch.setEpoch(static_cast<uint32_t>(epoch_));
  batch.setIndex(index_++);
  std::shared_ptr<const void> keep;
  fill(*b, batch, keep);
  return net::message::from_builder(std::move(b), std::move(keep));
}

} // namespace troupe::actors
