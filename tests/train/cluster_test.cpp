// The [cluster] table: its checks, which node a process is (--node or Slurm),
// Slurm's task layout, and the topology the plan is computed on.
#include <catch2/catch.hpp>
#include <stdlib.h>

#include <optional>

#include "tests/test_util.hpp"
#include "train/cluster.hpp"
#include "train/job_file.hpp"

using namespace troupe;
using namespace troupe::train;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using testing::message;

namespace {

cluster_spec three_nodes() {
  cluster_spec c;
  c.secret_file = "/tmp/secret";
  for (int i = 0; i < 3; ++i) {
    node_entry n;
    n.name = "n" + std::to_string(i);
    n.port = static_cast<uint16_t>(7001 + i);
    c.nodes.push_back(n);
  }
  c.nodes[2].shards = false;
  return c;
}

/// Sets environment variable `name` for the scope, then puts back what was there.
class scoped_env {
public:
  scoped_env(const char* name, const char* value) : name_(name) {
    if (const char* old = ::getenv(name)) old_ = std::string(old);
    ::setenv(name, value, 1);
  }
  ~scoped_env() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

private:
  const char* name_;
  std::optional<std::string> old_;
};

} // namespace

TEST_CASE("cluster: a description is checked before anything starts", "[cluster]") {
  CHECK_NOTHROW(validate(cluster_spec{}));
  CHECK_NOTHROW(validate(three_nodes()));
  auto fails = [](cluster_spec c, const std::string& what) {
    CHECK_THROWS_MATCHES(validate(c), troupe::error, message(Contains(what)));
  };
  cluster_spec c = three_nodes();
  c.secret_file.clear();
  fails(c, "needs a shared secret");
  c = three_nodes();
  c.nodes[1].name = "n0";
  fails(c, "two nodes are called 'n0'");
  c = three_nodes();
  c.nodes[2].port = 7001;
  fails(c, "listens on 127.0.0.1:7001 like another node");
  c = three_nodes();
  c.nodes[1].port = 0;
  fails(c, "node n1 has no port");
  c = three_nodes();
  c.heartbeat_s = 5;
  fails(c, "heartbeat must be shorter than peer-timeout");
  c = three_nodes();
  c.nodes[0].devices = {{"tpu", 1, 0}};
  fails(c, "device kind 'tpu'");
}

TEST_CASE("cluster: which node this process is", "[cluster]") {
  const cluster_spec c = three_nodes();
  CHECK(self_index(c, "n2", {}) == 2u);
  CHECK(self_index(c, "", {{"SLURM_PROCID", "1"}}) == 1u);
  CHECK(self_index(cluster_spec{}, "", {}) == 0u);
  CHECK_THROWS_MATCHES(self_index(c, "x", {}), troupe::error, message(Contains("--node x: the cluster has no such node (its nodes: n0, n1, n2)")));
  CHECK_THROWS_MATCHES(self_index(c, "", {}), troupe::error, message(Contains("with --node NAME (or start it with srun)")));
  CHECK_THROWS_MATCHES(self_index(c, "", {{"SLURM_PROCID", "5"}}), troupe::error, message(Contains("has 3 nodes")));
}

TEST_CASE("cluster: Slurm's tasks become nodes by block distribution", "[cluster]") {
  CHECK(expand_tasks_per_node("3") == std::vector<int>{3});
  CHECK(expand_tasks_per_node("2(x3),1") == std::vector<int>{2, 2, 2, 1});
  CHECK_THROWS_AS(expand_tasks_per_node("2(x"), troupe::error);
  const auto nodes = slurm_nodes({{"SLURM_NTASKS", "3"}, {"SLURM_TASKS_PER_NODE", "2,1"}}, {"a", "b"}, 7100);
  REQUIRE(nodes.size() == 3);
  CHECK(nodes[0].host == "a");
  CHECK(nodes[1].host == "a");
  CHECK(nodes[2].host == "b");
  CHECK(nodes[2].name == "task2");
  CHECK(nodes[2].port == 7102);
  CHECK_THROWS_MATCHES(slurm_nodes({{"SLURM_NTASKS", "4"}, {"SLURM_TASKS_PER_NODE", "2,1"}}, {"a", "b"}, 7100),
                       troupe::error, message(Contains("SLURM_NTASKS says 4")));
  CHECK_THROWS_MATCHES(slurm_nodes({{"SLURM_NTASKS", "3"}, {"SLURM_TASKS_PER_NODE", "3"}}, {"a", "b"}, 7100),
                       troupe::error, message(Contains("gives 1 hosts, the node list 2")));
}

TEST_CASE("cluster: the topology and the plan over it", "[cluster]") {
  const cluster_spec c = three_nodes();
  const topology t = topology_of(c, 1, 4);
  REQUIRE(t.nodes.size() == 3);
  CHECK(t.nodes[1].threads == 4);  // this node's own count
  CHECK(t.nodes[0].threads == 1);
  CHECK_FALSE(t.nodes[2].run_shards);
  CHECK(topology_of(cluster_spec{}, 0, 3).nodes.size() == 1);
}

TEST_CASE("cluster: a job file's [cluster] table, its nodes and their errors", "[cluster][job_file]") {
  const std::string ok = R"(
[cluster]
secret-file = "/tmp/s"
peer-timeout = 2
nodes = [
  { name = "a", port = 7001 },
  { name = "b", host = "10.0.0.2", port = 7002, shards = false, threads = 2, devices = [{ kind = "cpu", speed = 2.0 }] },
]
)";
  const job_spec s = parse_job_file(ok, "job.toml");
  REQUIRE(s.cluster.nodes.size() == 2);
  CHECK(s.cluster.nodes[1].host == "10.0.0.2");
  CHECK_FALSE(s.cluster.nodes[1].shards);
  CHECK(s.cluster.nodes[1].devices.at(0).speed == 2.0);
  CHECK(s.cluster.peer_timeout_s == 2.0);
  // Written out and read back: the same cluster.
  const job_spec again = parse_job_file(to_job_file(s), "dump.toml");
  CHECK(to_job_file(again) == to_job_file(s));

  auto fails = [](const std::string& text, const std::string& what) {
    CHECK_THROWS_MATCHES(parse_job_file(text, "job.toml"), troupe::error, message(Contains(what)));
  };
  fails("[cluster]\nnodes = [{ name = \"a\", prot = 1 }]\n", "job.toml:2: unknown key 'cluster.nodes[0].prot' (did you mean 'port'?)");
  fails("[cluster]\nnodes = [{ name = \"a\", port = \"x\" }]\n", "job.toml:2: cluster.nodes[0].port: expected an integer in [1, 65535]");
  fails("[cluster]\nnodes = 3\n", "cluster.nodes: expected an array of tables");
  fails("[cluster]\nnodes = [{ port = 7001 }]\n", "a node needs a name");
  fails("[cluster]\nsecret-flie = \"x\"\n", "unknown key 'cluster.secret-flie' (did you mean 'secret-file'?)");
  fails("[cluster]\nnodes = [{ name = \"a\", port = 1 }, { name = \"b\", port = 2 }]\n", "needs a shared secret");
  fails("algorithm = \"hogwild\"\n[cluster]\nsecret-file = \"s\"\nnodes = [{ name = \"a\", port = 1 }, { name = \"b\", port = 2 }]\n",
        "hogwild shares one buffer in one process");
}

// Bug (issue 21, item 19): every task under Slurm took all of the host's cores
// (3 tasks on 2 cores ran at a twentieth of the speed of one).
TEST_CASE("cluster: threads come from Slurm's CPUs per task, else the cores shared by the tasks on the host",
          "[cluster][threads]") {
  using env_map = std::map<std::string, std::string>;
  CHECK(default_threads({}, 8) == 8);
  CHECK(default_threads({}, 8, 3) == 2);   // three nodes of the job file on this host
  CHECK(default_threads({}, 2, 3) == 1);   // at least 1
  CHECK(default_threads({{"SLURM_CPUS_PER_TASK", "3"}}, 8) == 3);
  CHECK(default_threads({{"SLURM_CPUS_PER_TASK", "3"}, {"SLURM_TASKS_PER_NODE", "4"}}, 8, 4) == 3);
  // The issue's run: srun -n 3 on one host of 2 cores.
  const env_map three_on_one{{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "3"}, {"SLURM_TASKS_PER_NODE", "3"},
                             {"SLURM_NODEID", "0"}};
  CHECK(slurm_tasks_here(three_on_one) == 3);
  CHECK(default_threads(three_on_one, 2) == 1);
  CHECK(default_threads(three_on_one, 12) == 4);
  // The job's CPUs on this host (SLURM_CPUS_ON_NODE) bound the cores: 4 of a host of 64, for 2 tasks.
  const env_map four_cpus{{"SLURM_CPUS_ON_NODE", "4"}, {"SLURM_TASKS_PER_NODE", "2"}, {"SLURM_NODEID", "0"}};
  CHECK(default_threads(four_cpus, 64) == 2);
  CHECK(default_threads(four_cpus, 2) == 1);  // fewer CPUs to run on than allocated: those
  CHECK(default_threads({{"SLURM_CPUS_ON_NODE", "1"}, {"SLURM_TASKS_PER_NODE", "3"}}, 2) == 1);  // --overcommit
  // Hosts of 2, 2, 2 and 1 tasks: this process's host is the one SLURM_NODEID names.
  CHECK(default_threads({{"SLURM_TASKS_PER_NODE", "2(x3),1"}, {"SLURM_NODEID", "1"}}, 16) == 8);
  CHECK(default_threads({{"SLURM_TASKS_PER_NODE", "2(x3),1"}, {"SLURM_NODEID", "3"}}, 16) == 16);
  CHECK(default_threads({{"SLURM_TASKS_PER_NODE", "2(x3),1"}}, 16) == 8);  // no SLURM_NODEID: the most per host
  CHECK(default_threads({{"SLURM_NTASKS_PER_NODE", "4"}, {"SLURM_TASKS_PER_NODE", "2"}}, 16) == 4);
  CHECK(slurm_tasks_here({}) == 0);
  CHECK_THROWS_MATCHES(default_threads({{"SLURM_TASKS_PER_NODE", "2,1"}, {"SLURM_NODEID", "2"}}, 8), troupe::error,
                       message(Contains("SLURM_NODEID 2")));
  CHECK_THROWS_MATCHES(default_threads({{"SLURM_CPUS_PER_TASK", "x"}}, 8), troupe::error,
                       message(Contains("SLURM_CPUS_PER_TASK: 'x' is not a count")));
  CHECK(usable_cores() >= 1);
  // More threads than this process's CPUs: a note for the log, naming both counts.
  CHECK(oversubscription_note(usable_cores()).empty());
  CHECK(oversubscription_note(1).empty());
  const int over = usable_cores() + 3;
  CHECK_THAT(oversubscription_note(over),
             StartsWith("note: " + std::to_string(over) + " threads on the " + std::to_string(usable_cores()) +
                        " CPU(s) this process may use: they take turns"));
}

TEST_CASE("cluster: nodes of a job file on one host share its cores, explicit threads win", "[cluster][threads]") {
  cluster_spec c = three_nodes();  // all three on 127.0.0.1
  CHECK(topology_of(c, 1, 0, {}, 6).nodes[1].threads == 2);
  CHECK(topology_of(c, 1, 0, {}, 6).nodes[0].threads == 1);  // another node's cores are its own business
  CHECK(topology_of(c, 1, 3, {}, 6).nodes[1].threads == 3);  // the job's threads
  c.nodes[2].host = "localhost";                             // loopback all the same
  CHECK(topology_of(c, 0, 0, {}, 6).nodes[0].threads == 2);
  c.nodes[2].host = "10.0.0.3";  // another machine: two nodes share this one
  CHECK(topology_of(c, 0, 0, {}, 6).nodes[0].threads == 3);
  c.nodes[1].threads = 4;  // node n1 takes 4 of the 6: n0 gets what is left
  CHECK(topology_of(c, 0, 0, {}, 6).nodes[0].threads == 2);
  CHECK(topology_of(c, 1, 0, {}, 6).nodes[1].threads == 4);
  CHECK(topology_of(c, 0, 0, {{"SLURM_CPUS_PER_TASK", "5"}}, 6).nodes[0].threads == 5);
  // Slurm's tasks as nodes (resolve): the hosts Slurm gives.
  const auto nodes = slurm_nodes({{"SLURM_NTASKS", "3"}, {"SLURM_TASKS_PER_NODE", "2,1"}}, {"a", "b"}, 7100);
  cluster_spec s;
  s.secret_file = "/tmp/secret";
  s.nodes = nodes;
  CHECK(topology_of(s, 0, 0, {}, 8).nodes[0].threads == 4);
  CHECK(topology_of(s, 2, 0, {}, 8).nodes[2].threads == 8);
  // One process: its share of the cores too.
  CHECK(topology_of(cluster_spec{}, 0, 0, {{"SLURM_TASKS_PER_NODE", "2"}}, 8).nodes[0].threads == 4);
  CHECK(same_host("127.0.0.1", "localhost"));
  CHECK_FALSE(same_host("10.0.0.1", "10.0.0.2"));
}

TEST_CASE("cluster: the node processes on one host are noted when their threads exceed its CPUs", "[cluster][threads]") {
  cluster_spec c = three_nodes();  // all three on 127.0.0.1
  CHECK(host_threads_note(c, 0, 0, {}, 2).empty());  // the default: one thread each, the least they can take
  CHECK(host_threads_note(c, 0, 1, {}, 2).empty());
  CHECK(host_threads_note(c, 0, 0, {}, 6).empty());
  CHECK(host_threads_note(c, 1, 2, {}, 6).empty());  // 3 x 2 on 6
  const std::string over = host_threads_note(c, 1, 2, {}, 4);  // the job's --threads 2 on every node: 6 on 4
  CHECK(over == "note: the 3 node processes of this job on this host (n0, n1, n2) run 6 threads in all on the 4 "
                "CPU(s) this process may use: they take turns, which is slower than one thread per CPU (threads = "
                "0, the default, shares the host's CPUs among them)\n");
  c.nodes[2].host = "10.0.0.3";  // another machine: only n0 and n1 here
  CHECK(host_threads_note(c, 1, 2, {}, 4).empty());
  c.nodes[0].threads = 3;  // n0's own threads, n1 its share of what n0 leaves (1): 4 on 4
  CHECK(host_threads_note(c, 1, 0, {}, 4).empty());
  c.nodes[0].threads = 4;  // 4 + 1 on 4, noted on either node
  CHECK_THAT(host_threads_note(c, 0, 0, {}, 4), StartsWith("note: the 2 node processes of this job on this host (n0, n1) run 5 threads"));
  CHECK(host_threads_note(c, 0, 0, {}, 4) == host_threads_note(c, 1, 0, {}, 4));
  CHECK(host_threads_note(c, 2, 0, {}, 4).empty());  // n2's host is not theirs
  c.nodes[2].threads = 8;
  CHECK_THAT(host_threads_note(c, 2, 0, {}, 4), StartsWith("note: 8 threads on the 4 CPU(s) this process may use"));
  // One process: the job's --threads against its CPUs.
  CHECK(host_threads_note(cluster_spec{}, 0, 0, {}, 2).empty());
  CHECK(host_threads_note(cluster_spec{}, 0, 2, {}, 2).empty());
  CHECK_THAT(host_threads_note(cluster_spec{}, 0, 3, {}, 2), StartsWith("note: 3 threads on the 2 CPU(s)"));
}

TEST_CASE("cluster: a process under Slurm with no threads set takes Slurm's CPUs per task", "[cluster][threads]") {
  const scoped_env cpus("SLURM_CPUS_PER_TASK", "1");
  CHECK(topology::local(0).nodes.at(0).threads == 1);
  CHECK(topology::local(3).nodes.at(0).threads == 3);  // the job's threads win
  const scoped_env more("SLURM_CPUS_PER_TASK", "64");
  CHECK(topology::local(0).nodes.at(0).threads == 64);
}
