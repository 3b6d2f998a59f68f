// The evaluator without actors: a snapshot pulled from every shard and
// assembled into the model at each shard's offsets, evaluated and written as
// a checkpoint with the shards' versions and their rule state, sorted.
#include <catch2/catch.hpp>

#include <filesystem>

#include "actors/evaluator_core.hpp"
#include "net/checkpoint.hpp"
#include "tests/actors/ps_messages.hpp"
#include "tests/test_util.hpp"

using namespace troupe;
using namespace troupe::actors;
using namespace troupe::testing;
using Catch::Matchers::Contains;

namespace {

/// Five test samples for weight [[1, 0, 0], [0, 1, 0]] and bias [0, 0.5]:
/// logits (x0, x1 + 0.5); samples 0, 1 and 4 are right, 2 and 3 wrong (3 and
/// 4 only because of the bias): accuracy 0.6.
std::shared_ptr<const train::loaded_data> test_data() {
  auto d = std::make_shared<train::loaded_data>();
  d->sets.test = data::from_tensors(
      tensor::from({5, 3}, {1, 0, 0, 0, 1, 0, 2, 1, 0, 0.6f, 0.2f, 5, 0, 0, 1}), {0, 1, 1, 0, 1}, 2);
  d->sets.train = d->sets.test;
  d->norm = data::compute_normalization(d->sets.train);
  return d;
}
const std::vector<float> weight{1, 0, 0, 0, 1, 0};
const std::vector<float> bias{0, 0.5f};

evaluator_core::config two_shard_config(const std::string& checkpoint = {}) {
  evaluator_core::config c;
  c.self = evaluator_addr();
  const auto ranges = model::plan_shards(tiny_model().layout(), 2);
  for (uint32_t s = 0; s < 2; ++s) c.shards.push_back({shard_addr(s), ranges[s], {}, -1});
  c.data = test_data();
  c.batch_size = 2;
  c.checkpoint = checkpoint;
  c.algorithm = "ddc-asgd";
  return c;
}

net::message weight_params(uint64_t version, const std::vector<named_tensor>& state = {}) {
  return params_message(0, evaluator_addr(), version, 0, 0, {{shape{2, 3}, weight}}, 0, false, state);
}
net::message bias_params(uint64_t version, const std::vector<named_tensor>& state = {}) {
  return params_message(1, evaluator_addr(), version, 1, 6, {{shape{2}, bias}}, 0, false, state);
}

net::reject_reason reason_of(evaluator_core& e, const net::message& m) {
  try {
    e.on_params(m);
  } catch (const net::message_error& err) {
    return err.reason();
  }
  FAIL("accepted");
  return net::reject_reason::malformed;
}

} // namespace

TEST_CASE("evaluator: a snapshot of two shards, evaluated and checkpointed with versions and sorted rule state",
          "[actors][evaluator]") {
  temp_dir dir;
  const std::string path = dir.file("ckpt.bin");
  evaluator_core e(two_shard_config(path), tiny_model());
  CHECK(e.address() == evaluator_addr());
  CHECK_FALSE(e.active());

  snapshot_request req;
  req.epoch = 2;
  req.epochs_done = 2;
  req.steps = 7;
  req.evaluate = true;
  req.checkpoint = true;
  const std::vector<outgoing> pulls = e.begin(req);
  CHECK(e.active());
  CHECK_FALSE(e.complete());
  REQUIRE(pulls.size() == 2);
  for (uint32_t s = 0; s < 2; ++s) {
    CHECK(pulls[s].to == shard_addr(s));
    net::envelope_reader r(pulls[s].msg);
    REQUIRE(r.root().which() == wire::Envelope::PULL_PARAMS);
    CHECK(r.root().getPullParams().getShard() == s);
    CHECK(r.root().getPullParams().getWithState());  // a checkpoint needs the rule's state
    CHECK(net::read_address(r.root().getSource()) == evaluator_addr());
  }
  CHECK_THROWS_MATCHES(e.begin(req), troupe::error, testing::message(Contains("already in progress")));
  CHECK_THROWS_MATCHES(e.finish(), troupe::error, testing::message(Contains("waiting for shard 0 on node 0")));

  // Shard 1 answers first, with its rule's state in the order the rule keeps it.
  e.on_params(bias_params(5, {{"v", tensor::from({2}, {1, 2})}, {"ms/0", tensor::from({2}, {3, 4})}}));
  CHECK(e.missing() == "shard 0 on node 0");
  CHECK_FALSE(e.complete());
  // A second answer of shard 1 (a pull asked again): ignored, the first counts.
  CHECK_FALSE(e.on_params(bias_params(6)));
  CHECK(e.missing() == "shard 0 on node 0");
  // A shard it does not pull from, a wrong range, not a Params: refused.
  CHECK(reason_of(e, params_message(2, evaluator_addr(), 0, 2, 8, {{shape{1}, {1}}})) == net::reject_reason::wrong_shape);
  CHECK(reason_of(e, params_message(0, evaluator_addr(), 0, 0, 0, {{shape{3, 2}, weight}})) ==
        net::reject_reason::wrong_shape);
  CHECK(reason_of(e, make_pull(evaluator_addr(), shard_addr(0))) == net::reject_reason::unknown_kind);
  CHECK_FALSE(e.complete());
  e.on_params(weight_params(9, {{"v", tensor::from({6}, {6, 5, 4, 3, 2, 1})}}));
  REQUIRE(e.complete());

  const evaluation_result res = e.finish();
  CHECK_FALSE(e.active());
  CHECK(res.epoch == 2u);
  CHECK(res.test_accuracy == Approx(0.6));
  CHECK(res.checkpointed);

  const net::checkpoint c = net::load_checkpoint(path);
  CHECK(c.epoch == 2u);
  CHECK(c.step == 7u);
  CHECK(c.optimizer_kind == "ddc-asgd");
  CHECK(c.architecture == tiny_model().architecture());
  CHECK(c.shard_versions == std::vector<uint64_t>{9, 5});
  REQUIRE(c.params.size() == 2);
  CHECK(c.params[0].name == "0.dense.weight");
  CHECK(c.params[0].value.shape() == shape{2, 3});
  CHECK(c.params[0].value.to_vector() == weight);
  CHECK(c.params[1].name == "0.dense.bias");
  CHECK(c.params[1].value.to_vector() == bias);
  REQUIRE(c.optimizer.size() == 3);
  CHECK(c.optimizer[0].name == "shard0/v");
  CHECK(c.optimizer[0].value.to_vector() == std::vector<float>{6, 5, 4, 3, 2, 1});
  CHECK(c.optimizer[1].name == "shard1/ms/0");
  CHECK(c.optimizer[1].value.to_vector() == std::vector<float>{3, 4});
  CHECK(c.optimizer[2].name == "shard1/v");
  CHECK(c.optimizer[2].value.to_vector() == std::vector<float>{1, 2});

  // The next snapshot starts afresh: no state left over from the last one.
  snapshot_request plain;
  plain.epoch = 3;
  plain.evaluate = false;
  plain.checkpoint = false;
  const std::vector<outgoing> again = e.begin(plain);
  REQUIRE(again.size() == 2);
  CHECK_FALSE(net::envelope_reader(again[0].msg).root().getPullParams().getWithState());
  e.on_params(weight_params(10));
  e.on_params(bias_params(6));
  const evaluation_result r3 = e.finish();
  CHECK(r3.epoch == 3u);
  CHECK(r3.test_accuracy == -1.0);
  CHECK_FALSE(r3.checkpointed);
  CHECK(net::load_checkpoint(path).step == 7u);  // not rewritten
}

// Bug (issue 21, item 18): a checkpoint inside an epoch did not say how far
// into it the run was: a resumed run on actors trained the epoch from its start.
TEST_CASE("evaluator: a checkpoint inside an epoch records the samples of the epoch trained", "[actors][evaluator]") {
  temp_dir dir;
  const std::string path = dir.file("mid.ckpt");
  evaluator_core e(two_shard_config(path), tiny_model());
  snapshot_request sent;
  sent.epoch = 2;
  sent.epochs_done = 1;
  sent.steps = 13;
  sent.epoch_samples = 96;
  sent.evaluate = false;
  sent.checkpoint = true;
  sent.periodic = true;
  // As the coordinator's Snapshot carries it.
  const net::message m = make_snapshot(coordinator_addr(), evaluator_addr(), sent);
  const snapshot_request req = read_snapshot(net::envelope_reader(m));
  CHECK(req.epoch_samples == 96u);
  CHECK(req.periodic);
  e.begin(req);
  e.on_params(weight_params(3));
  e.on_params(bias_params(3));
  REQUIRE(e.complete());
  CHECK(e.finish().checkpointed);
  const net::checkpoint c = net::load_checkpoint(path);
  CHECK(c.epoch == 1u);
  CHECK(c.step == 13u);
  CHECK(c.epoch_samples == 96u);
}

TEST_CASE("evaluator: a Params before any snapshot is ignored (a late answer to a pull asked again)", "[actors][evaluator]") {
  evaluator_core e(two_shard_config(), tiny_model());
  CHECK_FALSE(e.on_params(weight_params(1)));
  CHECK_FALSE(e.active());
  // Without a checkpoint path nothing is written, even when asked.
  snapshot_request req;
  req.epoch = 1;
  req.checkpoint = true;
  e.begin(req);
  e.on_params(weight_params(1));
  e.on_params(bias_params(1));
  const evaluation_result r = e.finish();
  CHECK_FALSE(r.checkpointed);
  CHECK(r.test_accuracy == Approx(0.6));
}

TEST_CASE("evaluator: with Hogwild! the snapshot is the shared buffer, taken at once", "[actors][evaluator]") {
  std::vector<float> w = weight;
  w.insert(w.end(), bias.begin(), bias.end());
  auto store = std::make_shared<hogwild_store>(w.data(), static_cast<int64_t>(w.size()));
  temp_dir dir;
  evaluator_core::config c;
  c.self = evaluator_addr();
  c.hogwild = store;
  c.data = test_data();
  c.batch_size = 3;
  c.checkpoint = dir.file("h.bin");
  c.algorithm = "hogwild";
  evaluator_core e(c, tiny_model());
  snapshot_request req;
  req.epoch = 1;
  req.epochs_done = 1;
  req.steps = 4;
  req.checkpoint = true;
  CHECK(e.begin(req).empty());
  REQUIRE(e.complete());
  // The buffer changes after the snapshot: the snapshot does not.
  store->subtract(1.0f, w.data());
  const evaluation_result r = e.finish();
  CHECK(r.test_accuracy == Approx(0.6));
  REQUIRE(r.checkpointed);
  const net::checkpoint ck = net::load_checkpoint(c.checkpoint);
  CHECK(ck.params.at(0).value.to_vector() == weight);
  CHECK(ck.params.at(1).value.to_vector() == bias);
  CHECK(ck.shard_versions.empty());
  CHECK(ck.optimizer.empty());
  CHECK(ck.optimizer_kind == "hogwild");
}
