// The shard as a CAF actor: bad messages sent to it through CAF are rejected,
// counted and answered, and it keeps training.
#include <caf/all.hpp>
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <limits>
#include <sstream>

#include "actors/ps_actors.hpp"
#include "tests/actors/ps_messages.hpp"

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::net::message)

using namespace troupe;
using namespace troupe::testing;
using Catch::Matchers::Contains;

TEST_CASE("shard actor: malformed, wrong-shape and NaN messages are rejected; it keeps training", "[actors][caf]") {
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", size_t(1));
  cfg.set("logger.verbosity", caf::atom("quiet"));
  caf::actor_system sys{cfg};
  auto core = std::make_shared<actors::shard_core>(0, small_tensors(), small_rule("dc-asgd-a", 1), "constant", 100);
  std::ostringstream log;
  caf::actor shard = actors::spawn_shard(sys, core, 1, &log);
  caf::scoped_actor worker{sys};

  // What the shard sends back to this "worker"; an empty message if it does not answer.
  auto ask = [&](const net::message& m) {
    net::message reply;
    worker->send(shard, m);
    worker->receive([&](const net::message& r) { reply = r; },
                    caf::after(std::chrono::seconds(10)) >> [] {});
    return reply;
  };
  // The first message makes this actor worker 0 for the shard.
  net::message r = ask(actors::make_pull(0, 0));
  REQUIRE_FALSE(r.empty());
  CHECK(read_params(r).values == std::vector<float>{1, 2, 3});

  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<uint8_t> junk(256);
  for (std::size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<uint8_t>(i * 53 + 7);
  const std::vector<std::pair<const char*, net::message>> bad{
      {"random bytes", net::message::from_bytes(junk.data(), junk.size())},
      {"NaN gradient", push_message(0, 0, grad(1, nan, 1))},
      {"Inf gradient", push_message(0, 0, grad(-INFINITY, 1, 1))},
      {"wrong shape", push_message(0, 0, {{shape{2, 1}, {1, 2}}, {shape{1}, {1}}})},
      {"unexpected kind", actors::make_metrics(actors::step_report{})},
  };
  for (const auto& [what, m] : bad) {
    INFO(what);
    r = ask(m);
    REQUIRE_FALSE(r.empty());  // answered: the worker is not left waiting
    params_view v = read_params(r);
    CHECK(v.rejected);
    CHECK(v.version == 0u);
    CHECK(v.values == std::vector<float>{1, 2, 3});
  }
  // The shard still trains.
  r = ask(push_message(0, 0, grad(2, 2, 2)));
  REQUIRE_FALSE(r.empty());
  params_view v = read_params(r);
  CHECK_FALSE(v.rejected);
  CHECK(v.version == 1u);
  CHECK(v.values == std::vector<float>{0, 1, 2});
  CHECK(core->rejects().total() == bad.size());
  CHECK(core->rejects().get(net::reject_reason::non_finite) == 2);
  CHECK(core->rejects().get(net::reject_reason::wrong_shape) == 1);
  CHECK_THAT(log.str(), Contains("shard rejected a message"));
  caf::anon_send_exit(shard, caf::exit_reason::user_shutdown);
}
