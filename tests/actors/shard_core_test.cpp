// The parameter shard without actors: pulls, pushes, versions and
// staleness, replies addressed to the source of what they answer, copy on
// write of the Params a worker holds, bad messages, checkpoints, and the
// delay-compensated rules' w_bak after a rejected push.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <sstream>

#include "actors/messages.hpp"
#include "actors/shard_core.hpp"
#include "tests/actors/ps_messages.hpp"
#include "tests/test_util.hpp"

using namespace troupe;
using namespace troupe::actors;
using namespace troupe::testing;
using Catch::Matchers::Contains;
using model::algorithm_kind;

namespace {

/// Where a run of `algorithm` with `shards` shards (small_plan's first) starts from checkpoint `c`.
train::initial_state start_of(const net::checkpoint& c, const std::string& algorithm, int shards) {
  train::plan p;
  for (int i = 0; i < shards; ++i) {  // shards of small_plan()'s size, one after another
    train::shard_plan sp = small_plan();
    const model::shard_range r = sp.range;
    sp.range = {r.first + i * (r.last - r.first), r.last + i * (r.last - r.first), r.begin + i * r.numel(),
                r.end + i * r.numel()};
    sp.address.index = static_cast<uint32_t>(i);
    p.shards.push_back(sp);
  }
  p.samples_per_epoch = 100;
  settings s;
  s.algo.kind = parse_algorithm(algorithm);
  return train::resumed_start(c, p, s);
}

} // namespace

TEST_CASE("shard: pull, ASGD pushes, versions and staleness, replies go to the source", "[actors][shard]") {
  shard_core s = small_shard(algorithm_kind::asgd, 2);
  CHECK(s.address() == shard_addr(0));
  CHECK(s.id() == 0u);
  auto r = s.handle(make_pull(worker_addr(0), shard_addr(0)));
  REQUIRE(r.size() == 1);
  CHECK(r[0].to == worker_addr(0));
  params_view v = read_params(r[0].msg);
  CHECK(v.values == std::vector<float>{1, 2, 3});
  CHECK(v.source == shard_addr(0));
  CHECK(v.destination == worker_addr(0));
  CHECK(v.shard == 0u);
  CHECK(v.first == 0u);
  CHECK(v.offset == 0);

  // Worker 0 pushes on version 0: w - 0.5 g.
  r = s.handle(push_message(0, 0, grad(2, 4, 6)));
  REQUIRE(r.size() == 1);
  CHECK(r[0].to == worker_addr(0));
  v = read_params(r[0].msg);
  CHECK(v.values == std::vector<float>{0, 0, 0});
  CHECK(v.version == 1u);
  CHECK(v.tau == 0u);
  CHECK_FALSE(v.rejected);
  // Worker 1 also computed on version 0: staleness 1.
  r = s.handle(push_message(1, 0, grad(1, 1, 1)));
  REQUIRE(r.size() == 1);
  CHECK(r[0].to == worker_addr(1));
  v = read_params(r[0].msg);
  CHECK(v.tau == 1u);
  CHECK(v.version == 2u);
  CHECK(v.values == std::vector<float>{-0.5f, -0.5f, -0.5f});
  CHECK(s.version() == 2u);
  CHECK(s.staleness().count() == 2);
  CHECK(s.staleness().mean() == Approx(0.5));
  CHECK(s.staleness().max() == 1);
  CHECK(s.staleness().worker_mean(1) == Approx(1.0));
  // The evaluator's pull is answered to the evaluator and changes nothing.
  r = s.handle(make_pull(evaluator_addr(), shard_addr(0)));
  REQUIRE(r.size() == 1);
  CHECK(r[0].to == evaluator_addr());
  v = read_params(r[0].msg);
  CHECK(v.version == 2u);
  CHECK(v.tau == 0u);
  CHECK(v.values == std::vector<float>{-0.5f, -0.5f, -0.5f});
  CHECK(s.version() == 2u);
  CHECK(s.rejects().total() == 0u);
}

TEST_CASE("shard: a second shard takes and answers its own range of the layout", "[actors][shard]") {
  // Tensors [1, 3) of a layout whose tensor 0 has 4 elements: elements [4, 7).
  shard_core s(shard_plan_of(1, 1, 3, 4, 7), small_tensors(), small_rule(algorithm_kind::asgd, 1, 1.0f),
               model::lr_schedule::constant, 10, kernels::context{});
  auto r = s.handle(make_pull(worker_addr(0), shard_addr(1)));
  REQUIRE(r.size() == 1);
  params_view v = read_params(r[0].msg);
  CHECK(v.shard == 1u);
  CHECK(v.first == 1u);
  CHECK(v.offset == 4);
  CHECK(v.source == shard_addr(1));
  // A push of the same range is applied; one at offset 0 is the wrong range.
  r = s.handle(push_message(worker_addr(0), 0, grad(1, 1, 1), 1, 1, 4));
  CHECK_FALSE(read_params(r.at(0).msg).rejected);
  CHECK(read_params(r[0].msg).values == std::vector<float>{0, 1, 2});
  r = s.handle(push_message(worker_addr(0), 1, grad(1, 1, 1), 1, 1, 0));
  CHECK(read_params(r.at(0).msg).rejected);
  CHECK(s.rejects().get(net::reject_reason::wrong_shape) == 1u);
  CHECK_THAT(s.last_error(), Contains("expected tensors [1, 3) at offset 4"));
  // A pull for another shard's index is refused.
  r = s.handle(make_pull(worker_addr(0), shard_addr(0)));
  CHECK(read_params(r.at(0).msg).rejected);
  CHECK(s.rejects().get(net::reject_reason::wrong_shape) == 2u);
  // The constructor checks the tensors against the range.
  CHECK_THROWS_MATCHES(shard_core(shard_plan_of(0, 0, 3, 0, 3), small_tensors(), small_rule(algorithm_kind::asgd, 1),
                                  model::lr_schedule::constant, 10, kernels::context{}),
                       troupe::error, testing::message(Contains("2 tensors for the range [0, 3)")));
  CHECK_THROWS_MATCHES(shard_core(shard_plan_of(0, 0, 2, 0, 4), small_tensors(), small_rule(algorithm_kind::asgd, 1),
                                  model::lr_schedule::constant, 10, kernels::context{}),
                       troupe::error, testing::message(Contains("3 parameters for a range of 4")));
  CHECK_THROWS_AS(shard_core(shard_plan_of(0, 0, 0, 0, 0), {}, small_rule(algorithm_kind::asgd, 1),
                             model::lr_schedule::constant, 10, kernels::context{}),
                  troupe::error);
}

TEST_CASE("shard: a Params a worker holds never changes, updates go in place once it is let go", "[actors][shard]") {
  const tensor_list init{{shape{2}, {1, 2}}, {shape{1}, {3}}};
  tensor_list g = init;  // the gradient: 2 * the initial values
  std::vector<float> w0;
  for (auto& [sh, v] : g)
    for (float& x : v) {
      w0.push_back(x);
      x *= 2;
    }
  shard_core s = small_shard(algorithm_kind::asgd, 1, 0.25f);
  // ASGD, lr 0.25, gradient 2 w0: each push subtracts 0.5 w0.
  std::vector<float> w1(w0.size()), w2(w0.size()), w3(w0.size());
  for (std::size_t i = 0; i < w0.size(); ++i) {
    w1[i] = w0[i] * 0.5f;
    w2[i] = w1[i] - 0.5f * w0[i];
    w3[i] = w2[i] - 0.5f * w0[i];
  }
  net::message p0 = s.handle(make_pull(worker_addr(0), shard_addr(0))).at(0).msg;
  // The worker still holds p0: the update goes to a copy, p0 stays version 0.
  net::message p1 = s.handle(push_message(0, 0, g)).at(0).msg;
  CHECK(read_params(p0).values == w0);
  CHECK(read_params(p0).version == 0u);
  CHECK(read_params(p1).values == w1);
  CHECK(read_params(p1).version == 1u);
  CHECK(first_payload(p1) != first_payload(p0));
  p0 = net::message();
  // p1 is held through the next push too.
  net::message p2 = s.handle(push_message(0, 1, g)).at(0).msg;
  CHECK(read_params(p1).values == w1);
  CHECK(read_params(p1).version == 1u);
  CHECK(read_params(p2).values == w2);
  const float* where = first_payload(p2);
  p1 = net::message();
  p2 = net::message();
  // Nobody holds the parameters now: they are updated and answered in place,
  // the same buffer with a new header.
  auto r = s.handle(push_message(0, 2, g));
  const params_view v3 = read_params(r.at(0).msg);
  CHECK(v3.values == w3);
  CHECK(v3.version == 3u);
  CHECK(v3.tau == 0u);
  CHECK(first_payload(r[0].msg) == where);
  std::vector<float> snap;
  for (const auto& t : s.snapshot()) snap.insert(snap.end(), t.value.data(), t.value.data() + t.value.numel());
  CHECK(snap == w3);
  CHECK(s.snapshot().at(0).name == "a");
  CHECK(s.snapshot().at(1).value.shape() == shape{1});
  // A rejected push (base version ahead) is answered with the same parameters, flagged.
  auto bad = s.handle(push_message(0, 9, g));
  REQUIRE(bad.size() == 1);
  CHECK(bad[0].to == worker_addr(0));
  CHECK(read_params(bad[0].msg).rejected);
  CHECK(read_params(bad[0].msg).values == w3);
  CHECK(read_params(bad[0].msg).version == 3u);
  CHECK_FALSE(read_params(r[0].msg).rejected);  // the answer before keeps its header
}

TEST_CASE("shard: SSGD answers every worker of a round with one message", "[actors][shard]") {
  shard_core s = small_shard(algorithm_kind::ssgd, 2, 1.0f);
  CHECK(s.handle(push_message(0, 0, grad(2, 0, 0))).empty());  // waits for the round
  CHECK(s.version() == 0u);
  // A second gradient of worker 0 in the same round is refused, and answered.
  auto twice = s.handle(push_message(0, 0, grad(2, 0, 0)));
  REQUIRE(twice.size() == 1);
  CHECK(read_params(twice[0].msg).rejected);
  CHECK(s.rejects().get(net::reject_reason::malformed) == 1u);
  CHECK_THAT(s.last_error(), Contains("two gradients in one round"));
  auto r = s.handle(push_message(1, 0, grad(0, 2, 4)));
  REQUIRE(r.size() == 2);
  CHECK(s.version() == 1u);
  CHECK(r[0].to == worker_addr(0));
  CHECK(r[1].to == worker_addr(1));
  // The same immutable buffer goes to both workers.
  CHECK(r[0].msg.segments().begin() == r[1].msg.segments().begin());
  CHECK(read_params(r[0].msg).values == std::vector<float>{0, 1, 1});  // w - mean(g)
  CHECK(read_params(r[0].msg).version == 1u);
}

TEST_CASE("shard: a checkpoint pull carries the rule's state, a restored shard continues", "[actors][shard]") {
  shard_core a = small_shard(algorithm_kind::ddc_asgd, 2);
  for (uint32_t w = 0; w < 2; ++w) a.handle(make_pull(worker_addr(w), shard_addr(0)));
  a.handle(push_message(0, 0, grad(1, 2, 3)));
  a.handle(push_message(1, 0, grad(-1, 1, 2)));
  // A worker's pull carries no state; the evaluator's checkpoint pull does.
  {
    net::envelope_reader r(a.handle(make_pull(worker_addr(0), shard_addr(0))).at(0).msg);
    CHECK(r.root().getParams().getRuleState().size() == 0);
  }
  auto with_state = a.handle(make_pull(evaluator_addr(), shard_addr(0), true));
  REQUIRE(with_state.size() == 1);
  CHECK(with_state[0].to == evaluator_addr());
  net::envelope_reader r(with_state[0].msg);
  auto p = r.root().getParams();
  net::checkpoint c;
  c.optimizer_kind = "ddc-asgd";
  c.shard_versions = {p.getVersion()};
  for (auto& t : net::decode(p.getRuleState(), "state")) c.optimizer.push_back({"shard0/" + t.name, t.value});
  REQUIRE(c.optimizer.size() == 3);  // v, ms/0, ms/1
  CHECK(c.optimizer[0].name == "shard0/v");
  CHECK(c.optimizer[1].name == "shard0/ms/0");
  CHECK(c.optimizer[2].name == "shard0/ms/1");

  // A fresh shard with the checkpoint's parameters, restored, answers the next
  // pushes exactly as the original does.
  params_view now = read_params(a.handle(make_pull(evaluator_addr(), shard_addr(0))).at(0).msg);
  shard_core b(small_plan(2),
               {{"a", tensor::from({2}, {now.values[0], now.values[1]})}, {"b", tensor::from({1}, {now.values[2]})}},
               small_rule(algorithm_kind::ddc_asgd, 2), model::lr_schedule::constant, 100, kernels::context{});
  std::ostringstream log;
  resume_shard(b, start_of(c, "ddc-asgd", 1).shards[0], log);
  // Restored bit for bit: the version, and the rule state's digest is the checkpoint's.
  std::ostringstream expected;
  expected << "shard 0: resumed at version " << a.version() << ", rule state digest " << std::hex
           << net::state_digest(net::shard_state(c, 0)) << "\n";
  CHECK(log.str() == expected.str());
  CHECK(net::state_digest(b.rule_state()) == net::state_digest(a.rule_state()));
  CHECK(b.version() == a.version());
  for (auto* s : {&a, &b})
    for (uint32_t w = 0; w < 2; ++w) s->handle(make_pull(worker_addr(w), shard_addr(0)));
  for (uint32_t w = 0; w < 2; ++w) {
    params_view va = read_params(a.handle(push_message(w, 2, grad(0.5f, -1, 1))).at(0).msg);
    params_view vb = read_params(b.handle(push_message(w, 2, grad(0.5f, -1, 1))).at(0).msg);
    CHECK(va.values == vb.values);
    CHECK(va.version == vb.version);
    CHECK(va.tau == vb.tau);
  }

  // Another algorithm's checkpoint, another shard count, or another worker count: fresh, and said so.
  shard_core fresh = small_shard(algorithm_kind::ddc_asgd, 2);
  resume_shard(fresh, start_of(c, "dc-asgd-a", 1).shards[0], log);
  CHECK_THAT(log.str(), Contains("written by 'ddc-asgd', not dc-asgd-a"));
  resume_shard(fresh, start_of(c, "ddc-asgd", 2).shards[0], log);
  CHECK_THAT(log.str(), Contains("the checkpoint has 1 shard(s), this run 2"));
  shard_core one_worker = small_shard(algorithm_kind::ddc_asgd, 1);
  resume_shard(one_worker, start_of(c, "ddc-asgd", 1).shards[0], log);
  CHECK_THAT(log.str(), Contains("unexpected entry 'ms/1'"));
  CHECK(fresh.version() == 0u);
  CHECK(one_worker.version() == 0u);
}

TEST_CASE("shard: bad messages are rejected and counted, known workers are answered, training goes on",
          "[actors][shard]") {
  shard_core s = small_shard(algorithm_kind::dc_asgd_a, 2);
  const float nan = std::numeric_limits<float>::quiet_NaN();

  // A Params-sized push whose payload is one float short of its shapes.
  auto short_payload = [] {
    auto b = net::make_builder();
    auto p = net::init_envelope(*b, worker_addr(0), shard_addr(0)).initPushGradient();
    auto v = p.initValues();
    auto shapes = v.initShapes(2);
    shapes[0].initDims(1).set(0, 2);
    shapes[1].initDims(1).set(0, 1);
    v.initPayload(2 * sizeof(float));
    return net::message::from_builder(std::move(b));
  };

  struct bad_case {
    const char* what;
    net::message m;
    net::reject_reason reason;
  };
  // From worker 0, a known worker: each is answered with the unchanged parameters, flagged.
  std::vector<bad_case> answered{
      {"NaN gradient", push_message(0, 0, grad(nan, 1, 1)), net::reject_reason::non_finite},
      {"Inf gradient", push_message(0, 0, grad(1, INFINITY, 1)), net::reject_reason::non_finite},
      {"wrong shape", push_message(0, 0, {{shape{3}, {1, 2, 3}}, {shape{1}, {1}}}), net::reject_reason::wrong_shape},
      {"missing tensor", push_message(0, 0, {{shape{2}, {1, 2}}}), net::reject_reason::wrong_shape},
      {"wrong offset", push_message(worker_addr(0), 0, grad(1, 1, 1), 0, 0, 5), net::reject_reason::wrong_shape},
      {"push for another shard", push_message(worker_addr(0), 0, grad(1, 1, 1), 1), net::reject_reason::wrong_shape},
      {"payload shorter than its shapes", short_payload(), net::reject_reason::bad_tensor},
      {"version from the future", push_message(0, 5, grad(1, 1, 1)), net::reject_reason::malformed},
      {"unexpected kind", make_metrics(worker_addr(0), shard_addr(0), train::step_report{}),
       net::reject_reason::unknown_kind},
  };
  uint64_t total = 0;
  for (auto& c : answered) {
    INFO(c.what);
    auto r = s.handle(c.m);
    ++total;
    CHECK(s.rejects().get(c.reason) >= 1);
    CHECK(s.rejects().total() == total);
    REQUIRE(r.size() == 1);
    CHECK(r[0].to == worker_addr(0));
    params_view v = read_params(r[0].msg);
    CHECK(v.rejected);
    CHECK(v.destination == worker_addr(0));
    CHECK(v.values == std::vector<float>{1, 2, 3});
    CHECK(s.version() == 0u);
  }
  CHECK(s.rejects().get(net::reject_reason::non_finite) == 2u);
  CHECK(s.rejects().get(net::reject_reason::wrong_shape) == 4u);
  CHECK(s.rejects().get(net::reject_reason::bad_tensor) == 1u);
  CHECK_THAT(s.last_error(), Contains("a Metrics is not for a shard"));

  // Nobody is answered when the source cannot be read or is no known worker: counted only.
  std::vector<uint8_t> junk(200);
  for (std::size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<uint8_t>(i * 37 + 11);
  std::vector<bad_case> counted{
      {"random bytes", net::message::from_bytes(junk.data(), junk.size()), net::reject_reason::malformed},
      {"unknown schema version", push_message(worker_addr(0), 0, grad(1, 1, 1), 0, 0, 0, 99),
       net::reject_reason::unknown_version},
      {"unknown worker", push_message(7, 0, grad(1, 1, 1)), net::reject_reason::malformed},
      {"push from a loader", push_message(loader_addr(0), 0, grad(1, 1, 1)), net::reject_reason::malformed},
  };
  for (auto& c : counted) {
    INFO(c.what);
    const uint64_t before = s.rejects().get(c.reason);
    CHECK(s.handle(c.m).empty());
    CHECK(s.rejects().get(c.reason) == before + 1);
    CHECK(s.rejects().total() == ++total);
  }
  CHECK(s.version() == 0u);

  // Oversized: a shard reading untrusted input with a small limit answers its known worker.
  net::reader_limits small;
  small.max_bytes = 64;
  shard_core tight = small_shard(small_rule(algorithm_kind::asgd, 1), small);
  auto t = tight.handle(push_message(0, 0, grad(1, 1, 1)));
  CHECK(tight.rejects().get(net::reject_reason::too_large) == 1u);
  REQUIRE(t.size() == 1);
  CHECK(read_params(t[0].msg).rejected);

  // A valid push afterwards is applied as usual.
  auto r = s.handle(push_message(0, 0, grad(1, 1, 1)));
  REQUIRE(r.size() == 1);
  params_view v = read_params(r[0].msg);
  CHECK_FALSE(v.rejected);
  CHECK(v.version == 1u);
  CHECK(v.values[0] < 1.0f);
}

TEST_CASE("shard: DC-ASGD's w_bak after a rejected push is the parameters the rejected reply carried",
          "[actors][shard][rules]") {
  // DC-ASGD-c, eta 0.5, lambda 1: w <- w - eta * (g + lambda * g * g * (w - w_bak(m))).
  model::update_config c = small_rule(algorithm_kind::dc_asgd_c, 2, 0.5f);
  c.lambda = 1.0f;
  shard_core s = small_shard(c);
  const float eta = 0.5f, lambda = 1.0f;
  // Both workers hold w0 = {1, 2, 3}.
  for (uint32_t w = 0; w < 2; ++w) s.handle(make_pull(worker_addr(w), shard_addr(0)));
  // Worker 1 pushes {2, 0, -2} on w0: w_bak(1) = w, so w1 = w0 - 0.5 g = {0, 2, 4}.
  params_view v = read_params(s.handle(push_message(1, 0, grad(2, 0, -2))).at(0).msg);
  REQUIRE(v.values == std::vector<float>{0, 2, 4});
  // Worker 0's push is rejected (NaN): it is answered with w1, which it trains on next.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto rej = s.handle(push_message(0, 0, grad(nan, 1, 1)));
  REQUIRE(rej.size() == 1);
  const params_view held = read_params(rej[0].msg);
  REQUIRE(held.rejected);
  CHECK(held.version == 1u);
  const std::vector<float> w_bak = held.values;
  CHECK(w_bak == std::vector<float>{0, 2, 4});
  // Worker 1 pushes {2, 2, 0} on w1 (its own w_bak): w2 = w1 - 0.5 g = {-1, 1, 4}.
  v = read_params(s.handle(push_message(1, 1, grad(2, 2, 0))).at(0).msg);
  const std::vector<float> w2 = v.values;
  REQUIRE(w2 == std::vector<float>{-1, 1, 4});
  // Worker 0 pushes g = {1, 2, 1} computed on what the rejected reply carried (version 1).
  const std::vector<float> g{1, 2, 1};
  v = read_params(s.handle(push_message(0, 1, grad(g[0], g[1], g[2]))).at(0).msg);
  CHECK_FALSE(v.rejected);
  CHECK(v.tau == 1u);
  CHECK(v.version == 3u);
  std::vector<float> expect(3);
  for (int i = 0; i < 3; ++i) expect[i] = w2[i] - eta * (g[i] + lambda * g[i] * g[i] * (w2[i] - w_bak[i]));
  // By hand: g_hat = {1 + 1 * (-1 - 0), 2 + 4 * (1 - 2), 1 + 1 * (4 - 4)} = {0, -2, 1}.
  CHECK(expect == std::vector<float>{-1, 2, 3.5f});
  CHECK(v.values == expect);
  // Had w_bak(0) stayed w0 = {1, 2, 3} (the worker's pull), the update would be {-0.5, 2, 3}.
  CHECK(v.values != std::vector<float>{-0.5f, 2, 3});
}

TEST_CASE("shard: each pull and push is opened once, a bad one twice at most", "[actors][shard]") {
  shard_core s = small_shard(algorithm_kind::dc_asgd_a, 2);
  const net::message pull = make_pull(worker_addr(0), shard_addr(0));
  const net::message push = push_message(0, 0, grad(0.5f, -1, 1));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const net::message bad = push_message(1, 0, grad(nan, 1, 1));
  uint64_t before = net::messages_opened();
  REQUIRE(s.handle(pull).size() == 1);
  CHECK(net::messages_opened() - before == 1);
  before = net::messages_opened();
  REQUIRE(s.handle(push).size() == 1);
  CHECK(net::messages_opened() - before == 1);
  // A rejected message is looked at again, leniently, for the worker that waits for an answer.
  before = net::messages_opened();
  REQUIRE(s.handle(bad).size() == 1);
  CHECK(net::messages_opened() - before == 2);
  CHECK(s.rejects().total() == 1);
  // A Control STOP is no rejection: the shard asks its actor to stop.
  CHECK(s.handle(make_control(coordinator_addr(), shard_addr(0), wire::Control::Kind::STOP)).empty());
  CHECK(s.stop_requested());
  CHECK(s.rejects().total() == 1);
}
