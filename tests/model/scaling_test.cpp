// The scaling model's step times against hand-computed values and its limits.
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "model/scaling.hpp"
#include "tensor/error.hpp"

using namespace troupe;
using namespace troupe::model;

namespace {
scaling_inputs inputs(double compute, int64_t bytes, double a, double b) {
  scaling_inputs in;
  in.compute_s = compute;
  in.param_bytes = bytes;
  in.link = {a, b};
  in.piece_bytes = int64_t{1} << 40;  // one message per chunk unless a test says otherwise
  return in;
}
} // namespace

TEST_CASE("scaling: the ring and recursive doubling by hand", "[model][scaling]") {
  const link_cost l{1e-3, 0.5};
  CHECK(ring_allreduce_s(1000, 1, l, 1 << 20) == 0.0);
  CHECK(ring_allreduce_s(1000, 2, l, 1 << 20) == Approx(2 * (0.5 + 0.5)));          // one round each way: 500 bytes
  CHECK(ring_allreduce_s(1200, 4, l, 1 << 20) == Approx(6 * (0.3 + 0.5)));          // 2 (N - 1) rounds of 300 bytes
  CHECK(ring_allreduce_s(1200, 4, l, 100) == Approx(6 * (0.3 + 3 * 0.5)));          // 3 pieces per chunk
  CHECK(doubling_allreduce_s(1000, 4, l, 1 << 20) == Approx(2 * (1.0 + 0.5)));      // log2 4 rounds
  CHECK(doubling_allreduce_s(1000, 3, l, 1 << 20) == Approx((1 + 2) * (1.0 + 0.5)));  // fold in and out
  // The ring's bytes per member stay below twice the buffer however many members: bandwidth-optimal.
  const link_cost bw{1e-9, 0};
  CHECK(ring_allreduce_s(int64_t{1} << 30, 1024, bw, int64_t{1} << 40) < 2 * 1e-9 * (int64_t{1} << 30));
  CHECK(ring_allreduce_s(int64_t{1} << 30, 1024, bw, int64_t{1} << 40) > 1.99 * 1e-9 * (int64_t{1} << 30));
}

TEST_CASE("scaling: allreduce takes the cheaper algorithm for its size", "[model][scaling]") {
  scaling_inputs in = inputs(0.01, 4096, 1e-9, 1e-4);
  in.small_bytes = 8192;
  const scaling_estimate small = allreduce_estimate(in, 8);
  CHECK(small.comm_s == Approx(doubling_allreduce_s(4096, 8, in.link, in.piece_bytes)));
  in.param_bytes = 1 << 20;
  const scaling_estimate big = allreduce_estimate(in, 8);
  CHECK(big.comm_s == Approx(ring_allreduce_s(1 << 20, 8, in.link, in.piece_bytes)));
  CHECK(big.step_s == Approx(0.01 + big.comm_s));
  CHECK(big.efficiency == Approx(0.01 / big.step_s));
  CHECK(allreduce_estimate(in, 1).efficiency == Approx(1.0));
}

TEST_CASE("scaling: shards carry N pushes, and enough of them keep up", "[model][scaling]") {
  const scaling_inputs in = inputs(0.01, 1'000'000, 1e-8, 0);  // 10 ms per MB on each link
  // SSGD on one shard: its node takes in N - 1 gradients and sends back N - 1: linear in N.
  CHECK(ssgd_estimate(in, 5, 1).comm_s == Approx(2 * 4 * 0.01));
  // One shard per node moves as much as the ring: 2 (N - 1) / N of the model each way.
  CHECK(ssgd_estimate(in, 4, 4).comm_s == Approx(2 * 3 * 0.0025));
  CHECK(ssgd_estimate(in, 4, 4).comm_s == Approx(ring_allreduce_s(in.param_bytes, 4, in.link, in.piece_bytes)));
  // ASGD: many workers on one shard are bound by its link (the other nodes' pushes in, replies out:
  // about 63 of the model each way per 64 updates); more shards relieve it.
  const scaling_estimate one = asgd_estimate(in, 64, 1), many = asgd_estimate(in, 64, 64);
  CHECK(one.step_s == Approx(63 * 0.01));
  CHECK(many.step_s == Approx(0.01 + 2 * 0.01 * 63 / 64));  // then a worker's own round trip bounds it
  CHECK(many.efficiency > one.efficiency);
  const int needed = shards_to_keep_up(in, 64, 64);
  CHECK(needed > 1);
  CHECK(needed < 64);
  CHECK(asgd_estimate(in, 64, needed).step_s <= 1.05 * many.step_s);
  CHECK(asgd_estimate(in, 64, needed - 1).step_s > 1.05 * many.step_s);
  CHECK_THROWS_AS(ssgd_estimate(in, 0, 1), error);
  CHECK_THROWS_AS(asgd_estimate(in, 4, 0), error);
}

TEST_CASE("scaling: SSGD's two phases each last as long as the busiest direction of a link", "[model][scaling]") {
  scaling_inputs in = inputs(0.001, 1'000'000, 1e-8, 0);  // 1 ms of compute, 1 MB, 10 ms per MB
  // Even shares on 2 nodes: each direction carries half the model in each phase.
  CHECK(ssgd_estimate(in, 2, 2).comm_s == Approx(2 * 500'000 * 1e-8));
  // One shard on node 0: it takes in the other worker's whole push, then sends it the whole reply.
  CHECK(ssgd_estimate(in, 2, 1).comm_s == Approx(2 * 1'000'000 * 1e-8));
  // The same bytes as a ring allreduce's at N = 2 and 4 with even shares (2 (N - 1) / N of the model each way).
  CHECK(ssgd_estimate(in, 4, 4).comm_s == Approx(allreduce_estimate(in, 4).comm_s));
  // b per message: with 8 even shards on 8 nodes each node sends 7 pushes and takes in 7, then the
  // replies: each phase 7 messages' latency on top of 7/8 of the model.
  in.link.b = 1e-4;
  CHECK(ssgd_estimate(in, 8, 8).comm_s == Approx(2 * (7 * 125'000 * 1e-8 + 7 * 1e-4)));
}

TEST_CASE("scaling: shards hold whole tensors, and the largest bounds the shards' links", "[model][scaling]") {
  // The MLP's tensors: 784x256 and its bias, 256x128 and its bias, 128x10 and its bias (floats).
  scaling_inputs in = inputs(0.001, 0, 1e-8, 0);  // 10 ms per MB
  in.tensor_bytes = {4 * 200704, 4 * 256, 4 * 32768, 4 * 128, 4 * 1280, 4 * 10};
  for (int64_t t : in.tensor_bytes) in.param_bytes += t;
  const std::vector<double> three = shard_bytes(in, 3);
  REQUIRE(three.size() == 3);
  CHECK(three[0] == 4 * 200704);  // the first matrix alone: no cut makes the largest smaller
  CHECK(three[0] + three[1] + three[2] == Approx(static_cast<double>(in.param_bytes)));
  CHECK(shard_bytes(in, 64).size() == 6);  // no more shards than tensors
  // SSGD on 3 nodes: the first matrix's node takes in 2 pushes of it and sends 2 replies.
  CHECK(ssgd_estimate(in, 3, 3).comm_s == Approx(2 * 2 * 4 * 200704 * 1e-8));
  // Even shares would move a third of that: the cut by tensors is what the model must see.
  scaling_inputs even = in;
  even.tensor_bytes.clear();
  CHECK(ssgd_estimate(even, 3, 3).comm_s < 0.5 * ssgd_estimate(in, 3, 3).comm_s);
  // ASGD: a round of 3 updates puts on the first matrix's node its worker's pushes out and 2 replies of
  // the matrix; the step is that or a worker's own cycle (push and replies but its own node's share),
  // whichever is longer: with 4 workers the round is.
  const double round3 = (in.param_bytes - three[0]) + 2 * three[0];
  const double cycle = 0.001 + 2 * (in.param_bytes - *std::min_element(three.begin(), three.end())) * 1e-8;
  CHECK(asgd_estimate(in, 3, 3).step_s == Approx(std::max(round3 * 1e-8, cycle)));
  const double round4 = (in.param_bytes - three[0]) + 3 * three[0];
  CHECK(asgd_estimate(in, 4, 3).step_s == Approx(round4 * 1e-8));
  CHECK_THROWS_AS(shard_bytes(in, 0), error);
}

TEST_CASE("scaling: buckets overlap the reduction with backward, all but the last", "[model][scaling]") {
  scaling_inputs in = inputs(0.03, 3'000'000, 1e-8, 0);  // the ring of 3 MB among 2: 30 ms
  in.backward_s = 0.02;
  const double whole = allreduce_estimate(in, 2).step_s;
  CHECK(whole == Approx(0.03 + 0.03));
  in.bucket_bytes = 1'000'000;  // three buckets of 10 ms: two during backward (20 ms), one after
  CHECK(allreduce_estimate(in, 2).step_s == Approx(0.01 + 0.02 + 0.01));
  in.backward_s = 0.001;  // a short backward hides little
  CHECK(allreduce_estimate(in, 2).step_s == Approx(0.029 + 0.02 + 0.01));
}

TEST_CASE("scaling: without overlap every bucket's reduction follows backward", "[model][scaling]") {
  scaling_inputs in = inputs(0.03, 3'000'000, 1e-8, 0);  // the ring of 3 MB among 2: 30 ms
  in.backward_s = 0.02;
  in.bucket_bytes = 1'000'000;
  in.overlap_backward = false;  // more node processes than cores
  CHECK(allreduce_estimate(in, 2).step_s == Approx(0.03 + 0.03));
}

TEST_CASE("scaling: TCP over Ethernet carries less payload than the link's rate", "[model][scaling]") {
  // A veth's tbf counts 1 514 bytes for 1 448 of payload.
  const link_cost veth = tcp_link(1e9, 50e-6, 1500, 14);
  CHECK(veth.a == Approx(8e-9 * 1514 / 1448.0));
  CHECK(veth.b == 50e-6);
  CHECK(1.0 / veth.a == Approx(119.55e6).epsilon(1e-3));  // bytes/s of payload on 1 Gbit/s
  CHECK(tcp_link(1e9, 0, 9000, 38).a < veth.a);  // jumbo frames waste less
  CHECK_THROWS_AS(tcp_link(0, 0, 1500, 14), error);
  CHECK_THROWS_AS(tcp_link(1e9, 0, 40, 14), error);
}

TEST_CASE("scaling: set_compute takes the layers' costs, backward from the last layer", "[model][scaling]") {
  scaling_inputs in;
  set_compute(in, {{0.001, 0.002, 10, 0}, {0.003, 0.004, 0, 0}, {0.005, 0.006, 20, 0}});
  CHECK(in.compute_s == Approx(0.021));
  CHECK(in.backward_s == Approx(0.012));
  REQUIRE(in.gradient_ready.size() == 3);
  CHECK(in.gradient_ready[0].first == 10);
  CHECK(in.gradient_ready[0].second == Approx(0.012));  // the first layer's gradients last
  CHECK(in.gradient_ready[2].first == 20);
  CHECK(in.gradient_ready[2].second == Approx(0.006));
}

TEST_CASE("scaling: a shard's pushes leave once backward has finished its part", "[model][scaling]") {
  // 4 ms of forward, 6 ms of backward; the first layer's 0.1 MB finished at its end, the last
  // layer's 0.9 MB after 1 ms; 10 ms per MB each way.
  scaling_inputs in = inputs(0.01, 1'000'000, 1e-8, 0);
  in.backward_s = 0.006;
  in.gradient_ready = {{100'000, 0.006}, {900'000, 0.001}};
  in.tensor_bytes = {100'000, 900'000};  // two shards of whole tensors
  // SSGD, 2 workers: node 1 takes in node 0's push of the large shard from 1 ms (done at 10 ms), node 1's
  // push of the small one leaves at 6 ms; then the replies, the busiest direction 0.9 MB.
  CHECK(ssgd_estimate(in, 2, 2).step_s == Approx(0.004 + 0.010 + 0.009));
  // ASGD: the worker beside the small shard pushes the large one from 1 ms; then its replies.
  CHECK(asgd_estimate(in, 2, 2).step_s == Approx(0.004 + 0.010 + 0.009));
  scaling_inputs late = in;  // without the parts' times, or where nothing overlaps: after backward
  late.gradient_ready.clear();
  CHECK(ssgd_estimate(late, 2, 2).step_s == Approx(0.01 + 0.009 + 0.009));
  CHECK(asgd_estimate(late, 2, 2).step_s == Approx(0.01 + 0.009 + 0.009));
  in.overlap_backward = false;
  CHECK(ssgd_estimate(in, 2, 2).step_s == Approx(ssgd_estimate(late, 2, 2).step_s));
  CHECK(asgd_estimate(in, 2, 2).step_s == Approx(asgd_estimate(late, 2, 2).step_s));
  // Even shares of 0.5 MB: the first one holds the first layer's bytes, finished last.
  in.overlap_backward = true;
  in.tensor_bytes.clear();
  CHECK(ssgd_estimate(in, 2, 2).step_s == Approx(0.004 + 0.006 + 0.005 + 0.005));
  CHECK(asgd_estimate(in, 2, 2).step_s == Approx(0.004 + 0.006 + 0.005));  // own shard 0, pushes shard 1 early
}

TEST_CASE("scaling: scale_compute stretches the compute and when backward finishes each part", "[model][scaling]") {
  scaling_inputs in;
  set_compute(in, {{0.001, 0.002, 10, 0}, {0.005, 0.006, 20, 0}});
  scale_compute(in, 2);
  CHECK(in.compute_s == Approx(0.028));
  CHECK(in.backward_s == Approx(0.016));
  CHECK(in.gradient_ready[0].second == Approx(0.016));
  CHECK(in.gradient_ready[1].second == Approx(0.012));
  CHECK(in.gradient_ready[1].first == 20);  // the bytes stay
}
