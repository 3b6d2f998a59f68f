// The data loader without actors: Batch messages addressed from the loader
// to its worker, holding the batcher's batches of its part of the data.
#include <catch2/catch.hpp>

#include "actors/loader_core.hpp"
#include "data/dataset.hpp"
#include "tests/actors/ps_messages.hpp"
#include "tests/test_util.hpp"

using namespace troupe;
using namespace troupe::actors;
using namespace troupe::testing;
using Catch::Matchers::Contains;

namespace {

train::loader_plan plan_of(uint32_t i, int64_t begin, int64_t end, uint64_t seed) {
  train::loader_plan p;
  p.address = loader_addr(i);
  p.worker = worker_addr(i);
  p.begin = begin;
  p.end = end;
  p.seed = seed;
  return p;
}

/// Reads every batch the loader makes for `epochs` epochs and checks it
/// against the batcher's over the same part of the data.
void check_against_batcher(loader_core& loader, const data::image_dataset& ds, const data::normalization& norm,
                           const train::loader_plan& p, int64_t batch_size, int first_epoch, int epochs) {
  data::batcher ref(ds, batch_size, norm, p.seed, true, p.begin, p.end);
  uint64_t index = 0;
  for (int epoch = first_epoch; epoch < first_epoch + epochs; ++epoch) {
    ref.start_epoch(epoch);
    data::batch want;
    while (ref.next(want)) {
      INFO("epoch " << epoch << ", " << want.labels.size() << " samples");
      net::message m = loader.next();
      net::envelope_reader r(m);
      REQUIRE(r.root().which() == wire::Envelope::BATCH);
      CHECK(net::read_address(r.root().getSource()) == p.address);
      CHECK(net::read_address(r.root().getDestination()) == p.worker);
      auto b = r.root().getBatch();
      CHECK(b.getEpoch() == static_cast<uint32_t>(epoch));
      CHECK(b.getIndex() == index++);
      net::tensor_view img = net::view(b.getImages(), "test");
      CHECK(img.dims == want.images.shape());
      CHECK(std::vector<float>(img.data, img.data + img.numel()) == want.images.to_vector());
      std::vector<int32_t> labels;
      for (int32_t l : b.getLabels()) labels.push_back(l);
      CHECK(labels == want.labels);
    }
  }
}

} // namespace

TEST_CASE("loader: Batch messages carry the batcher's batches, made in place, across epochs", "[actors][loader]") {
  data::image_dataset ds;
  ds.count = 7;
  ds.height = 2;
  ds.width = 3;
  for (int64_t i = 0; i < ds.count * 6; ++i) ds.pixels.push_back(static_cast<uint8_t>(i * 5 % 251));
  for (int64_t i = 0; i < ds.count; ++i) ds.labels.push_back(static_cast<uint8_t>(i % 10));
  const data::normalization norm{{0.5f}, {0.25f}};
  // Samples [1, 7) in batches of 4: 4 + 2 per epoch.
  const train::loader_plan p = plan_of(3, 1, 7, 11);
  loader_core loader(ds, norm, 4, p);
  CHECK(loader.address() == loader_addr(3));
  CHECK(loader.worker() == worker_addr(3));
  CHECK(loader.batches_per_epoch() == 2);
  CHECK(loader.epoch() == 0);
  check_against_batcher(loader, ds, norm, p, 4, 0, 2);
  CHECK(loader.epoch() == 1);

  // A resumed run's loader starts at its first epoch.
  loader_core resumed(ds, norm, 4, p, 3);
  CHECK(resumed.epoch() == 3);
  check_against_batcher(resumed, ds, norm, p, 4, 3, 1);
}

TEST_CASE("loader: float samples travel as they are", "[actors][loader]") {
  std::vector<float> values;
  for (int i = 0; i < 5 * 4; ++i) values.push_back(0.5f * static_cast<float>(i) - 3.0f);
  const data::image_dataset ds = data::from_tensors(tensor::from({5, 2, 2}, values), {0, 1, 2, 1, 0}, 3);
  const data::normalization norm = data::compute_normalization(ds);
  const train::loader_plan p = plan_of(0, 0, 5, 5);
  loader_core loader(ds, norm, 2, p);
  CHECK(loader.batches_per_epoch() == 3);
  check_against_batcher(loader, ds, norm, p, 2, 0, 1);
  // Every sample comes through exactly: each image is one of the samples, with its label.
  loader_core again(ds, norm, 5, p);
  net::envelope_reader r(again.next());
  auto b = r.root().getBatch();
  net::tensor_view img = net::view(b.getImages(), "test");
  REQUIRE(img.dims == shape{5, 2, 2});
  std::vector<bool> seen(5, false);
  for (int i = 0; i < 5; ++i) {
    const int sample = static_cast<int>((img.data[i * 4] + 3.0f) / 2.0f);  // first value: 2 * sample - 3
    REQUIRE(sample >= 0);
    REQUIRE(sample < 5);
    seen[sample] = true;
    for (int k = 0; k < 4; ++k) CHECK(img.data[i * 4 + k] == values[sample * 4 + k]);
    CHECK(b.getLabels()[i] == std::vector<int32_t>{0, 1, 2, 1, 0}[sample]);
  }
  CHECK(seen == std::vector<bool>(5, true));
}

TEST_CASE("loader: an empty part of the data is an error when a batch is due", "[actors][loader]") {
  const data::image_dataset ds = data::from_tensors(tensor::zeros({3, 2}), {0, 1, 0}, 2);
  loader_core loader(ds, data::normalization{}, 2, plan_of(1, 2, 2, 1));
  CHECK_THROWS_MATCHES(loader.next(), troupe::error, testing::message(Contains("its part of the data is empty")));
}

// Bug (issue 21, item 18): a run on actors resumed from a checkpoint inside an
// epoch started that epoch's batches over in its loaders.
TEST_CASE("loader: a run resumed inside an epoch skips the loader's share of the samples trained", "[actors][loader]") {
  data::image_dataset ds;
  ds.count = 12;
  ds.height = 1;
  ds.width = 2;
  for (int64_t i = 0; i < ds.count * 2; ++i) ds.pixels.push_back(static_cast<uint8_t>(i * 7 % 251));
  for (int64_t i = 0; i < ds.count; ++i) ds.labels.push_back(static_cast<uint8_t>(i % 10));
  const data::normalization norm{{0.5f}, {0.25f}};
  // Loader 1 of 2: samples [6, 12) in batches of 2, 3 per epoch.
  const train::loader_plan p = plan_of(1, 6, 12, 5);
  // The batches of epoch 2 after the first `skipped` ones.
  auto rest_of_epoch = [&](int skipped) {
    data::batcher ref(ds, 2, norm, p.seed, true, p.begin, p.end);
    ref.start_epoch(2);
    std::vector<std::vector<int32_t>> labels;
    for (data::batch b; ref.next(b);) labels.push_back(b.labels);
    labels.erase(labels.begin(), labels.begin() + skipped);
    return labels;
  };
  auto labels_of = [](const net::message& m) {
    net::envelope_reader r(m);
    std::vector<int32_t> out;
    for (int32_t l : r.root().getBatch().getLabels()) out.push_back(l);
    return std::pair{r.root().getBatch().getEpoch(), out};
  };
  struct resume {
    int64_t epoch_samples, expect_skipped;
    int batches_skipped;
  };
  // 8 of the epoch's 12 samples: this loader's half is 4, 2 batches. 6 of 12:
  // 3, rounded up to whole batches. None: nothing skipped.
  for (resume r : {resume{8, 4, 2}, resume{6, 4, 2}, resume{2, 2, 1}, resume{0, 0, 0}}) {
    INFO(r.epoch_samples << " samples trained");
    loader_core loader(ds, norm, 2, p, 2);
    CHECK(loader.skip_trained(r.epoch_samples, 12) == r.expect_skipped);
    for (const std::vector<int32_t>& want : rest_of_epoch(r.batches_skipped)) {
      const auto [epoch, got] = labels_of(loader.next());
      CHECK(epoch == 2u);
      CHECK(got == want);
    }
    // The next epoch is whole.
    for (int i = 0; i < 3; ++i) CHECK(labels_of(loader.next()).first == 3u);
    CHECK(loader.epoch() == 3);
  }
}
