// The holder side of the parameter conversation (param_holder), shared by
// the shard and the pipeline stage, and the stage's update strategies
// (stage_weights): copy on write of a version someone holds, replies that
// share the held message, state, kept pulls; the own step against flat_optimizer,
// an allreduce of one, a shard's push and answer, kinds a strategy refuses.
#include <catch2/catch.hpp>

#include <vector>

#include "actors/messages.hpp"
#include "actors/param_holder.hpp"
#include "actors/stage_weights.hpp"
#include "net/tensor_codec.hpp"
#include "tests/actors/ps_messages.hpp"

using namespace troupe;
using namespace troupe::actors;
using namespace troupe::testing;
using Catch::Matchers::Contains;

namespace {

net::address stage_addr(uint32_t i) { return {0, net::role::stage, i}; }

/// A holder of the range [2, 5) of a layout: tensors of 2 and 1 values at offset 10.
param_holder small_holder(const std::vector<float>& init = {1, 2, 3}) {
  return param_holder(shard_addr(3), 3, model::shard_range{2, 4, 10, 13}, {shape{2}, shape{1}}, init.data(),
                      kernels::context::with_threads(1));
}

} // namespace

TEST_CASE("param_holder: replies share the held message, an update while it is held goes to a copy",
          "[actors][holder]") {
  param_holder h = small_holder();
  CHECK(h.size() == 3);
  net::message a = h.reply(worker_addr(0));
  params_view v = read_params(a);
  CHECK(v.values == std::vector<float>{1, 2, 3});
  CHECK(v.shard == 3u);
  CHECK(v.first == 2u);
  CHECK(v.offset == 10);
  CHECK(v.destination == worker_addr(0));
  // Same header, still held: the same message (its first recipient's destination).
  net::message b = h.reply(worker_addr(1));
  CHECK(first_payload(b) == first_payload(a));

  // A version held (a micro-batch in flight, a message on its way) never changes.
  param_holder::held kept = h.hold();
  float* w = h.writable();
  CHECK(w != kept.values);
  w[0] = 7;
  h.bump();
  CHECK(kept.values[0] == 1.0f);
  CHECK(read_params(a).values == std::vector<float>{1, 2, 3});
  CHECK(h.version() == 1u);

  // Nobody else holds it now: written in place, the header set in place.
  a = b = net::message();
  kept = {};
  net::message c = h.reply(worker_addr(2), 4, true);
  v = read_params(c);
  CHECK(v.values == std::vector<float>{7, 2, 3});
  CHECK(v.version == 1u);
  CHECK(v.tau == 4u);
  CHECK(v.rejected);
  c = net::message();
  const float* before = h.values();
  CHECK(h.writable() == before);
  const std::vector<float> next{4, 5, 6};
  h.assign(next.data());
  CHECK(h.values() == before);
  CHECK(h.version() == 2u);
  CHECK(read_params(h.reply(worker_addr(0))).values == next);
}

TEST_CASE("param_holder: a reply with state, kept pulls answered once due, a wrong size refused", "[actors][holder]") {
  param_holder h = small_holder();
  const std::vector<named_tensor> state{{"velocity", tensor::from({3}, {0.5f, 0.25f, 0})}};
  net::message m = h.reply_with_state(stage_addr(0), state);
  net::envelope_reader r(m);
  const auto got = net::decode(r.root().getParams().getRuleState(), "state");
  REQUIRE(got.size() == 1);
  CHECK(got[0].name == "velocity");
  CHECK(got[0].value.at({1}) == 0.25f);
  CHECK(read_params(m).values == std::vector<float>{1, 2, 3});

  h.keep(3, {worker_addr(1), false});
  h.keep(1, {worker_addr(2), true});
  std::vector<param_holder::pull> answered;
  h.answer_due(2, [&](const param_holder::pull& p) { answered.push_back(p); });
  REQUIRE(answered.size() == 1);
  CHECK(answered[0].from == worker_addr(2));
  CHECK(answered[0].with_state);
  h.answer_due(3, [&](const param_holder::pull& p) { answered.push_back(p); });
  REQUIRE(answered.size() == 2);
  CHECK(answered[1].from == worker_addr(1));

  const std::vector<float> two{1, 2};
  CHECK_THROWS_WITH(param_holder(shard_addr(0), 0, model::shard_range{0, 1, 0, 3}, {shape{2}}, two.data(),
                                 kernels::context::with_threads(1)),
                    Contains("2 parameters for a range of 3"));
}

TEST_CASE("stage_weights: the own step is flat_optimizer's, keeps its momentum as state and restores it",
          "[actors][stage]") {
  model::flat_optimizer_options o;
  o.lr = 0.5f;
  o.momentum = 0.9f;
  o.total_steps = 10;
  auto s = own_stage_weights(o, 3, "stage 0");
  param_holder h = small_holder();
  model::flat_optimizer ref(o, 3);
  std::vector<float> w{1, 2, 3};
  const kernels::context ctx = kernels::context::with_threads(1);
  std::vector<outgoing> out;
  for (int64_t step = 0; step < 3; ++step) {
    std::vector<float> g{1, -1, 0.5f}, g2 = g;
    CHECK(s->update(ctx, {step, step}, g.data(), h, out));
    ref.step(ctx, w.data(), g2.data(), step);
  }
  CHECK(out.empty());
  CHECK(h.version() == 3u);
  CHECK(std::vector<float>(h.values(), h.values() + 3) == w);
  CHECK_FALSE(s->waiting());
  const std::vector<named_tensor> st = s->state();
  REQUIRE(st.size() == 1);
  CHECK(st[0].name == "velocity");
  CHECK(std::vector<float>(st[0].value.data(), st[0].value.data() + 3) == ref.state());

  auto fresh = own_stage_weights(o, 3, "stage 0");
  fresh->restore(st);
  const std::vector<named_tensor> restored = fresh->state();
  REQUIRE(restored.size() == 1);
  CHECK(std::vector<float>(restored[0].value.data(), restored[0].value.data() + 3) == ref.state());
  CHECK_THROWS_WITH(fresh->restore({{"velocity", tensor::from({2}, {1, 2})}}), Contains("stage 0"));
  // Params or a Collective are no own step's.
  net::message p = params_message(0, stage_addr(0), 1, 2, 10, {{shape{2}, {1, 2}}, {shape{1}, {3}}});
  CHECK_THROWS_WITH(s->take(net::envelope_reader(p), h, out), Contains("stage 0: Params for a stage without a shard"));
}

TEST_CASE("stage_weights: the own AdamW step counts the updates before it, not the mini-batch (1F1B: one per "
          "micro-batch)",
          "[actors][stage]") {
  model::flat_optimizer_options o;
  o.adamw = true;
  o.lr = 0.1f;
  o.total_steps = 10;
  const kernels::context ctx = kernels::context::with_threads(1);
  std::vector<outgoing> out;
  auto s = own_stage_weights(o, 3, "stage 0");
  param_holder h = small_holder();
  model::flat_optimizer ref(o, 3);
  std::vector<float> w{1, 2, 3};
  // Two micro-batches' updates of mini-batch 0: bias corrections for t = 1, then t = 2.
  for (int64_t before : {0, 1}) {
    std::vector<float> g{1, -2, 0.5f}, g2 = g;
    CHECK(s->update(ctx, {0, before}, g.data(), h, out));
    ref.step(ctx, w.data(), g2.data(), 0, before);
  }
  CHECK(std::vector<float>(h.values(), h.values() + 3) == w);
  model::flat_optimizer by_step(o, 3);  // counting the mini-batch instead: t = 1 twice, another result
  std::vector<float> w2{1, 2, 3};
  for (int i = 0; i < 2; ++i) {
    std::vector<float> g{1, -2, 0.5f};
    by_step.step(ctx, w2.data(), g.data(), 0);
  }
  CHECK(w2 != w);
}

TEST_CASE("stage_weights: an allreduce of one member steps at once, a shard push waits for its answer",
          "[actors][stage]") {
  model::flat_optimizer_options o;
  o.lr = 1.0f;
  o.total_steps = 10;
  const kernels::context ctx = kernels::context::with_threads(1);
  std::vector<outgoing> out;
  {
    auto s = allreduce_stage_weights(o, 3, {stage_addr(0)}, 0);
    param_holder h = small_holder();
    std::vector<float> g{1, 1, 1};
    CHECK(s->reduce(ctx, g.data(), out));  // the mean over one member: g itself
    CHECK(g == std::vector<float>{1, 1, 1});
    CHECK(s->update(ctx, {0, 0}, g.data(), h, out));
    CHECK(std::vector<float>(h.values(), h.values() + 3) == std::vector<float>{0, 1, 2});
    CHECK_FALSE(s->waiting());
  }
  // A hybrid's stage 1, whose parameters are the shard's range [2, 4) of a layout.
  const model::param_layout layout({{"a", shape{10}}, {"b", shape{2}}, {"c", shape{2}}, {"d", shape{1}}});
  const model::shard_range range{2, 4, 12, 15};
  auto s = shard_stage_weights(stage_addr(1), shard_addr(0), range, 1, layout);
  param_holder h(stage_addr(1), 1, range, layout.shapes(2, 4), std::vector<float>{1, 2, 3}.data(), ctx);
  const std::vector<outgoing> pulls = s->start();
  REQUIRE(pulls.size() == 1);
  CHECK(pulls[0].to == shard_addr(0));
  CHECK(s->waiting());
  CHECK(s->start().empty());
  const tensor_list values{{shape{2}, {5, 6}}, {shape{1}, {7}}};
  CHECK(s->take(net::envelope_reader(params_message(0, stage_addr(1), 0, 2, 12, values)), h, out) ==
        stage_weights::taken::applied);
  CHECK_FALSE(s->waiting());
  CHECK(std::vector<float>(h.values(), h.values() + 3) == std::vector<float>{5, 6, 7});
  std::vector<float> g{1, 2, 3};
  CHECK(s->reduce(ctx, g.data(), out));  // nothing to reduce: the shard averages
  CHECK(out.empty());
  CHECK_FALSE(s->update(ctx, {0, 0}, g.data(), h, out));
  REQUIRE(out.size() == 1);
  CHECK(out[0].to == shard_addr(0));
  CHECK(s->waiting());
  // Another holder's answer does not fit; the shard's answer is the new weights, with its staleness.
  CHECK_THROWS_AS(s->take(net::envelope_reader(params_message(1, stage_addr(1), 1, 2, 12, values)), h, out),
                  net::message_error);
  const tensor_list next{{shape{2}, {4, 4}}, {shape{1}, {4}}};
  CHECK(s->take(net::envelope_reader(params_message(0, stage_addr(1), 1, 2, 12, next, 2)), h, out) ==
        stage_weights::taken::applied);
  CHECK(std::vector<float>(h.values(), h.values() + 3) == std::vector<float>{4, 4, 4});
  CHECK(h.version() == 2u);
  const staleness_tally t = s->take_tally();
  CHECK(t.count == 1u);
  CHECK(t.max == 2u);
  CHECK(s->take_tally().count == 0u);
}
