// The shard as a CAF actor routing by address: replies reach the worker the
// directory names; bad messages are rejected, counted and answered when
// their source is a known worker; it keeps training and stops on Control stop.
#include <caf/all.hpp>
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <limits>
#include <sstream>

#include "actors/roles.hpp"
#include "tests/actors/ps_messages.hpp"

using namespace troupe;
using namespace troupe::testing;
using Catch::Matchers::Contains;

TEST_CASE("shard actor: malformed, wrong-shape and NaN messages are rejected, it keeps training", "[actors][caf]") {
  std::ostringstream log;  // outlives the actor system
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", size_t(1));
  cfg.set("logger.verbosity", caf::atom("quiet"));
  caf::actor_system sys{cfg};
  auto core = std::make_shared<actors::shard_core>(small_plan(), small_tensors(),
                                                   small_rule(model::algorithm_kind::dc_asgd_a, 1),
                                                   model::lr_schedule::constant, 100, kernels::context{});
  auto dir = std::make_shared<actors::directory>();
  caf::scoped_actor worker{sys};
  caf::actor shard = actors::spawn_shard(sys, core, dir, &log);
  // The directory is filled before the first message: the shard and this "worker 0".
  dir->add(shard_addr(0), shard);
  dir->add(worker_addr(0), caf::actor{worker});
  worker->monitor(shard);

  // What the shard sends back to this worker; an empty message if nothing comes.
  auto ask = [&](const net::message& m) {
    net::message reply;
    actors::send_to(*dir, shard_addr(0), m);
    worker->receive([&](const net::message& r) { reply = r; }, caf::after(std::chrono::seconds(10)) >> [] {});
    return reply;
  };
  net::message r = ask(actors::make_pull(worker_addr(0), shard_addr(0)));
  REQUIRE_FALSE(r.empty());
  params_view v = read_params(r);
  CHECK(v.values == std::vector<float>{1, 2, 3});
  CHECK(v.destination == worker_addr(0));
  CHECK(v.source == shard_addr(0));

  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::pair<const char*, net::message>> bad{
      {"NaN gradient", push_message(0, 0, grad(1, nan, 1))},
      {"Inf gradient", push_message(0, 0, grad(-INFINITY, 1, 1))},
      {"wrong shape", push_message(0, 0, {{shape{2, 1}, {1, 2}}, {shape{1}, {1}}})},
      {"unexpected kind", actors::make_metrics(worker_addr(0), shard_addr(0), train::step_report{})},
  };
  for (const auto& [what, m] : bad) {
    INFO(what);
    r = ask(m);
    REQUIRE_FALSE(r.empty());  // answered: the worker is not left waiting
    v = read_params(r);
    CHECK(v.rejected);
    CHECK(v.version == 0u);
    CHECK(v.values == std::vector<float>{1, 2, 3});
  }

  // Nobody to answer: random bytes (no readable source) and an unknown worker.
  // The pull's reply, sent after them, is the next message that arrives.
  std::vector<uint8_t> junk(256);
  for (std::size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<uint8_t>(i * 53 + 7);
  actors::send_to(*dir, shard_addr(0), net::message::from_bytes(junk.data(), junk.size()));
  actors::send_to(*dir, shard_addr(0), push_message(7, 0, grad(1, 1, 1)));
  r = ask(actors::make_pull(worker_addr(0), shard_addr(0)));
  REQUIRE_FALSE(r.empty());
  v = read_params(r);
  CHECK_FALSE(v.rejected);
  CHECK(v.version == 0u);

  // The shard still trains.
  r = ask(push_message(0, 0, grad(2, 2, 2)));
  REQUIRE_FALSE(r.empty());
  v = read_params(r);
  CHECK_FALSE(v.rejected);
  CHECK(v.version == 1u);
  CHECK(v.values == std::vector<float>{0, 1, 2});
  CHECK(core->rejects().total() == bad.size() + 2);
  CHECK(core->rejects().get(net::reject_reason::non_finite) == 2);
  CHECK(core->rejects().get(net::reject_reason::wrong_shape) == 1);
  CHECK(core->rejects().get(net::reject_reason::unknown_kind) == 1);
  CHECK(core->rejects().get(net::reject_reason::malformed) == 2);
  CHECK_THAT(log.str(), Contains("shard 0 on node 0 rejected a message"));

  // A Control stop, routed by address, ends it.
  actors::send_to(*dir, shard_addr(0),
                  actors::make_control(coordinator_addr(), shard_addr(0), wire::Control::Kind::STOP));
  bool down = false;
  worker->receive([&](const caf::down_msg& d) { down = d.source == shard.address(); },
                  caf::after(std::chrono::seconds(10)) >> [] {});
  CHECK(down);
}
