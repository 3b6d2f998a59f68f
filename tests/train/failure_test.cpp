// What fit throws when a run fails: a type per kind of failure (diverged, bad
// message, lost node, timeout), in one process and in a cluster, so that a
// caller can tell them apart.
#include <catch2/catch.hpp>
#include <sys/stat.h>

#include <fstream>
#include <string>

#include "actors/fit.hpp"
#include "model/zoo.hpp"
#include "net/message.hpp"
#include "tests/net/net_test_util.hpp"
#include "tests/test_util.hpp"

using namespace troupe;
using Catch::Matchers::Contains;

namespace {

job diverging_job(const std::string& data_dir, algorithm a) {
  return job()
      .model([] { return zoo::mlp(); }, "mlp")
      .data(data::idx_dir(data_dir))
      .algorithm(a)
      .epochs(4)
      .batch_size(32)
      .lr(1e9f)  // the loss leaves the floats within a few steps
      .momentum(0.9f)
      .seed(7)
      .threads(1)
      .evaluate(false)
      .progress(progress_mode::none);
}

} // namespace

TEST_CASE("failure kinds: each type is thrown as itself and read back from its wire value", "[train][failure]") {
  for (failure f : {failure::other, failure::diverged, failure::bad_message, failure::lost_node, failure::timeout}) {
    try {
      throw_failure(f, "what");
    } catch (const error& e) {
      CHECK(failure_of(e) == f);
      CHECK(std::string(e.what()) == "what");
    }
    CHECK(failure_from(static_cast<unsigned>(f)) == f);
  }
  CHECK(failure_from(99) == failure::other);
  // A message the reader rejects is a bad message.
  CHECK(failure_of(net::message_error(net::reject_reason::malformed, "x")) == failure::bad_message);
  CHECK(failure_of(std::runtime_error("x")) == failure::other);
}

TEST_CASE("fit throws diverged_error when the loss is no longer finite, in the loop and on actors",
          "[train][failure][actors]") {
  testing::temp_dir dir{"troupe_failure"};
  testing::write_dataset(dir.path());
  std::ostringstream log;
  CHECK_THROWS_MATCHES(fit(diverging_job(dir.path(), sequential_sgd()), log), diverged_error,
                       Catch::Matchers::Predicate<diverged_error>(
                           [](const diverged_error& e) { return std::string(e.what()).find("diverged") != std::string::npos; },
                           "names the divergence"));
  CHECK_THROWS_AS(fit(diverging_job(dir.path(), asgd().workers(1)), log), diverged_error);
}

TEST_CASE("fit throws timeout_error when a node of the cluster does not join in time", "[train][failure][cluster]") {
  testing::temp_dir dir{"troupe_failure"};
  testing::write_dataset(dir.path());
  const std::string secret = dir.path() + "/secret";
  std::ofstream(secret) << "0123456789abcdef0123456789abcdef";
  REQUIRE(::chmod(secret.c_str(), 0600) == 0);
  const auto ports = testing::free_ports(2);
  train::cluster_spec c;
  c.secret_file = secret;
  c.join_timeout_s = 1;
  train::node_entry a, b;
  a.name = "a";
  a.port = ports[0];
  b.name = "b";
  b.port = ports[1];
  c.nodes = {a, b};
  std::ostringstream log;
  // Node b is never started.
  CHECK_THROWS_MATCHES(fit(diverging_job(dir.path(), asgd().workers(2)).lr(0.01f).cluster(c).node("a"), log),
                       timeout_error,
                       Catch::Matchers::Predicate<timeout_error>(
                           [](const timeout_error& e) { return std::string(e.what()).find("did not join") != std::string::npos; },
                           "names what it waited for"));
}
