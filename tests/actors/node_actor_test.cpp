#include <catch2/catch.hpp>

#include "actors/node_actor.hpp"

using namespace troupe::actors;

TEST_CASE("a join timeout blames the nodes without a link to the coordinator's node", "[node_actor]") {
  // Node b is linked but waits for node c, which never connected: c is to blame, not b.
  CHECK(to_blame({1, 2}, {true, true, false}) == std::vector<uint32_t>{2});
  // Every missing node is linked: they wait for links among themselves, all are named.
  CHECK(to_blame({1, 2}, {true, true, true}) == std::vector<uint32_t>{1, 2});
  CHECK(to_blame({}, {true, false}).empty());
}

TEST_CASE("a refused node is named with its address and the reason", "[node_actor]") {
  link_watch w({"a", "b", "c"}, 0);
  w.up(1);
  w.refused(2, "127.0.0.1:7003", "bad_mac", "node 2 (claimed) failed authentication");
  w.refused(2, "127.0.0.1:7003", "bad_mac", "node 2 (claimed) failed authentication");
  CHECK(w.is_up(1));
  CHECK_FALSE(w.is_up(2));
  CHECK(w.up_count() == 1);
  const std::string s = w.describe({2});
  CHECK(s.find("c (127.0.0.1:7003)") == 0);
  CHECK(s.find("claiming to be) node c were refused (2 times)") != std::string::npos);
  CHECK(s.find("wrong secret") != std::string::npos);
  CHECK(w.describe({1}).find("b: its link is up, but it did not join") == 0);
  // A connection refused before its hello named a node: said after the nodes, with its address.
  w.refused(no_node, "127.0.0.1:5000", "wrong_job", "another job");
  CHECK(w.describe({2}).find("; refused before they named a node: 1 connection(s), the last from 127.0.0.1:5000: "
                             "another job (the job files or data differ)") != std::string::npos);
}

TEST_CASE("a lost link says why, a link back up forgets it", "[node_actor]") {
  link_watch w({"a", "b"}, 1);
  CHECK(w.why_missing(0).find("no connection came") == 0);
  w.up(0);
  w.down(0, "no frame from node 0 for 3 s");
  CHECK(w.why_missing(0) == "its link was lost: no frame from node 0 for 3 s");
  w.up(0);
  CHECK(w.why_missing(0).find("its link is up") == 0);
  CHECK(describe_refusal("wrong_job").find("another job") == 0);
  CHECK(describe_refusal("something_new") == "something_new");
}
