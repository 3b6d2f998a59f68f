// The loader as a CAF actor: a loader that cannot make a batch tells the
// coordinator why on the Control channel, as every role does, and stops.
#include <caf/all.hpp>
#include <catch2/catch.hpp>

#include <chrono>

#include "actors/roles.hpp"
#include "data/dataset.hpp"
#include "tests/actors/ps_messages.hpp"

using namespace troupe;
using namespace troupe::testing;
using Catch::Matchers::Contains;

TEST_CASE("loader actor: a failure reaches the coordinator as a typed Control error", "[actors][caf]") {
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", size_t(1));
  cfg.set("logger.verbosity", caf::atom("quiet"));
  caf::actor_system sys{cfg};
  const data::image_dataset ds = data::from_tensors(tensor::zeros({3, 2}), {0, 1, 0}, 2);
  train::loader_plan p;
  p.address = loader_addr(0);
  p.worker = worker_addr(0);
  p.begin = p.end = 1;  // an empty part: the loader has no batch to make
  auto core = std::make_shared<actors::loader_core>(ds, data::normalization{}, 2, p, 0);
  auto dir = std::make_shared<actors::directory>();
  caf::scoped_actor coordinator{sys};
  caf::actor loader = actors::spawn_loader(sys, core, coordinator_addr(), dir);
  dir->add(loader_addr(0), loader);
  dir->add(coordinator_addr(), caf::actor{coordinator});
  coordinator->monitor(loader);

  actors::send_to(*dir, loader_addr(0), actors::make_control(worker_addr(0), loader_addr(0), wire::Control::Kind::CREDIT, 1));
  net::message got;
  coordinator->receive([&](const net::message& m) { got = m; }, caf::after(std::chrono::seconds(10)) >> [] {});
  REQUIRE_FALSE(got.empty());
  net::envelope_reader r(got);
  CHECK(r.root().which() == wire::Envelope::CONTROL);
  CHECK(net::read_header(got).source == loader_addr(0));
  auto c = r.root().getControl();
  CHECK(c.getKind() == wire::Control::Kind::ERROR);
  CHECK(static_cast<failure>(c.getAmount()) == failure::other);
  CHECK_THAT(std::string(c.getDetail().cStr()), Contains("its part of the data is empty"));
  bool down = false;
  coordinator->receive([&](const caf::down_msg&) { down = true; }, caf::after(std::chrono::seconds(10)) >> [] {});
  CHECK(down);
}
