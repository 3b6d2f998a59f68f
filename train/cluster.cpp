#include "train/cluster.hpp"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <sys/wait.h>
#include <thread>

extern char** environ;

#include "tensor/error.hpp"

namespace troupe::train {

namespace {

std::string get(const std::map<std::string, std::string>& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() ? std::string() : it->second;
}

int parse_count(const std::string& s, const std::string& what) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 6)
    throw error(what + ": '" + s + "' is not a count");
  return std::stoi(s);
}

} // namespace

void validate(const cluster_spec& c) {
  auto bad = [](const std::string& m) { throw error("cluster: " + m); };
  std::set<std::string> names, places;
  for (const node_entry& n : c.nodes) {
    if (n.name.empty()) bad("a node without a name");
    if (!names.insert(n.name).second) bad("two nodes are called '" + n.name + "'");
    if (c.nodes.size() > 1) {
      if (n.port == 0) bad("node " + n.name + " has no port");
      if (!places.insert(n.host + ":" + std::to_string(n.port)).second)
        bad("node " + n.name + " listens on " + n.host + ":" + std::to_string(n.port) + " like another node");
    }
    if (n.threads < 0) bad("node " + n.name + ": threads must be >= 0");
    for (const auto& d : n.devices) {
      if (d.kind != "cpu" && d.kind != "cuda") bad("node " + n.name + ": device kind '" + d.kind + "' (cpu or cuda)");
      if (!(d.speed > 0) || !std::isfinite(d.speed)) bad("node " + n.name + ": a device's speed must be > 0");
      if (d.memory_mb < 0) bad("node " + n.name + ": a device's memory must be >= 0");
    }
  }
  auto positive = [&](double v, const char* what) {
    if (!(v > 0) || !std::isfinite(v)) bad(std::string(what) + " must be > 0 seconds");
  };
  positive(c.join_timeout_s, "join-timeout");
  positive(c.peer_timeout_s, "peer-timeout");
  positive(c.heartbeat_s, "heartbeat");
  if (c.heartbeat_s >= c.peer_timeout_s) bad("heartbeat must be shorter than peer-timeout");
  if (c.checkpoint_every_steps < 0) bad("checkpoint-every-steps must be >= 0");
  if (!(c.checkpoint_every_s >= 0)) bad("checkpoint-every-seconds must be >= 0");
  if (c.nodes.size() > 1 && c.secret_file.empty())
    bad("a cluster of " + std::to_string(c.nodes.size()) +
        " nodes needs a shared secret: secret-file = \"...\" (a file of random bytes, mode 0600, the same on every node)");
}

namespace {

/// This node's threads where neither it nor the job sets them: its share of
/// the cores the other nodes on its host leave.
int share_of_host(const cluster_spec& c, uint32_t self, const std::map<std::string, std::string>& env, int cores) {
  int sharing = 0, taken = 0;
  for (std::size_t i = 0; i < c.nodes.size(); ++i) {
    if (!same_host(c.nodes[i].host, c.nodes[self].host)) continue;
    if (c.nodes[i].threads > 0 && i != self)
      taken += c.nodes[i].threads;
    else
      ++sharing;
  }
  return default_threads(env, std::max(1, cores - taken), std::max(1, sharing));
}

/// The threads node `i` takes: its own `threads`, else the job's (`job_threads` > 0), else its share of
/// the host (one process: default_threads).
int node_threads(const cluster_spec& c, uint32_t i, int job_threads, const std::map<std::string, std::string>& env,
                 int cores) {
  if (!c.single_process() && c.nodes[i].threads > 0) return c.nodes[i].threads;
  if (job_threads > 0) return job_threads;
  return c.single_process() ? default_threads(env, cores) : share_of_host(c, i, env, cores);
}

} // namespace

topology topology_of(const cluster_spec& c, uint32_t self, int local_threads) {
  return topology_of(c, self, local_threads, environment(), usable_cores());
}

topology topology_of(const cluster_spec& c, uint32_t self, int local_threads,
                     const std::map<std::string, std::string>& env, int cores) {
  if (c.single_process()) return topology::local(node_threads(c, 0, local_threads, env, cores));
  if (self >= c.nodes.size())
    throw error("topology: node " + std::to_string(self) + " of a cluster of " + std::to_string(c.nodes.size()));
  topology t;
  for (std::size_t i = 0; i < c.nodes.size(); ++i) {
    const node_entry& n = c.nodes[i];
    // Another node's threads, where it leaves them to its host, are its own business: 1 here.
    const int threads = i == self ? node_threads(c, self, local_threads, env, cores) : std::max(1, n.threads);
    node_spec spec{n.name, threads, n.workers, n.shards, {}};
    for (std::size_t d = 0; d < n.devices.size(); ++d)
      spec.devices.push_back({n.devices[d].kind + std::to_string(d), n.devices[d].speed, n.devices[d].memory_mb * 1048576});
    t.nodes.push_back(std::move(spec));
  }
  t.peer_timeout_s = c.peer_timeout_s;
  return t;
}

uint32_t self_index(const cluster_spec& c, const std::string& node_name,
                    const std::map<std::string, std::string>& env) {
  if (!node_name.empty()) {
    for (std::size_t i = 0; i < c.nodes.size(); ++i)
      if (c.nodes[i].name == node_name) return static_cast<uint32_t>(i);
    std::string names;
    for (const auto& n : c.nodes) names += (names.empty() ? "" : ", ") + n.name;
    throw error("--node " + node_name + ": the cluster has no such node (its nodes: " +
                (names.empty() ? std::string("none, it runs in one process") : names) + ")");
  }
  const std::string procid = get(env, "SLURM_PROCID");
  if (!procid.empty()) {
    const int i = parse_count(procid, "SLURM_PROCID");
    if (i >= static_cast<int>(c.nodes.size()))
      throw error("SLURM_PROCID " + procid + " but the cluster has " + std::to_string(c.nodes.size()) + " nodes");
    return static_cast<uint32_t>(i);
  }
  if (c.single_process()) return 0;
  throw error("this cluster has " + std::to_string(c.nodes.size()) +
              " nodes: say which one this process is with --node NAME (or start it with srun)");
}

std::vector<std::string> slurm_hostnames(const std::string& nodelist) {
  if (nodelist.empty()) throw error("Slurm: SLURM_JOB_NODELIST is empty");
  if (nodelist.find_first_of("'\\;|&$`\n") != std::string::npos)
    throw error("Slurm: SLURM_JOB_NODELIST '" + nodelist + "' holds characters a host list does not");
  const std::string cmd = "scontrol show hostnames '" + nodelist + "' 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) throw error("Slurm: cannot run scontrol to expand SLURM_JOB_NODELIST");
  std::string out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = ::pclose(p);
  if (status != 0)
    throw error("Slurm: `scontrol show hostnames " + nodelist + "` failed: " + out);
  std::vector<std::string> hosts;
  std::size_t pos = 0;
  while (pos < out.size()) {
    std::size_t nl = out.find('\n', pos);
    if (nl == std::string::npos) nl = out.size();
    if (nl > pos) hosts.push_back(out.substr(pos, nl - pos));
    pos = nl + 1;
  }
  if (hosts.empty()) throw error("Slurm: scontrol gave no host for SLURM_JOB_NODELIST " + nodelist);
  return hosts;
}

std::map<std::string, std::string> environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv = *e;
    const std::size_t eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

cluster_spec resolve(const cluster_spec& c, const std::map<std::string, std::string>& env) {
  if (!c.nodes.empty() || get(env, "SLURM_PROCID").empty()) return c;
  const std::string ntasks = get(env, "SLURM_NTASKS");
  if (ntasks.empty() || parse_count(ntasks, "SLURM_NTASKS") < 2) return c;
  cluster_spec out = c;
  out.nodes = slurm_nodes(env, slurm_hostnames(get(env, "SLURM_JOB_NODELIST")), c.slurm_port);
  validate(out);
  return out;
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

std::string oversubscription_note(int threads) { return oversubscription_note(threads, usable_cores()); }

std::string oversubscription_note(int threads, int cores) {
  if (threads <= cores) return "";
  return "note: " + std::to_string(threads) + " threads on the " + std::to_string(cores) +
         " CPU(s) this process may use: they take turns, which is slower than one thread per CPU (--threads 0 "
         "takes this process's share)\n";
}

std::string host_threads_note(const cluster_spec& c, uint32_t self, int job_threads,
                              const std::map<std::string, std::string>& env, int cores) {
  if (c.single_process()) return oversubscription_note(node_threads(c, 0, job_threads, env, cores), cores);
  int threads = 0;
  std::string names;
  int processes = 0;
  for (std::size_t i = 0; i < c.nodes.size(); ++i) {
    if (!same_host(c.nodes[i].host, c.nodes.at(self).host)) continue;
    threads += node_threads(c, static_cast<uint32_t>(i), job_threads, env, cores);
    names += (names.empty() ? "" : ", ") + c.nodes[i].name;
    ++processes;
  }
  if (threads <= std::max(cores, processes)) return "";  // one thread each is the least they can take
  if (processes == 1) return oversubscription_note(threads, cores);
  return "note: the " + std::to_string(processes) + " node processes of this job on this host (" + names + ") run " +
         std::to_string(threads) + " threads in all on the " + std::to_string(cores) +
         " CPU(s) this process may use: they take turns, which is slower than one thread per CPU (threads = 0, the "
         "default, shares the host's CPUs among them)\n";
}

std::string host_threads_note(const cluster_spec& c, uint32_t self, int job_threads) {
  return host_threads_note(c, self, job_threads, environment(), usable_cores());
}

int slurm_tasks_here(const std::map<std::string, std::string>& env) {
  const std::string per_node = get(env, "SLURM_NTASKS_PER_NODE");
  if (!per_node.empty()) return parse_count(per_node, "SLURM_NTASKS_PER_NODE");
  const std::string layout = get(env, "SLURM_TASKS_PER_NODE");
  if (layout.empty()) return 0;
  const std::vector<int> tasks = expand_tasks_per_node(layout);
  if (tasks.empty()) return 0;
  const std::string node = get(env, "SLURM_NODEID");
  if (node.empty()) return *std::max_element(tasks.begin(), tasks.end());
  const int i = parse_count(node, "SLURM_NODEID");
  if (i >= static_cast<int>(tasks.size()))
    throw error("Slurm: SLURM_NODEID " + node + " but SLURM_TASKS_PER_NODE '" + layout + "' names " +
                std::to_string(tasks.size()) + " host(s)");
  return tasks[static_cast<std::size_t>(i)];
}

int default_threads(const std::map<std::string, std::string>& env, int cores, int same_host) {
  const std::string per_task = get(env, "SLURM_CPUS_PER_TASK");
  if (!per_task.empty()) return std::max(1, parse_count(per_task, "SLURM_CPUS_PER_TASK"));
  // Slurm's CPUs for this job on this host, where its tasks are not confined to them.
  const std::string on_node = get(env, "SLURM_CPUS_ON_NODE");
  if (!on_node.empty()) cores = std::min(cores, std::max(1, parse_count(on_node, "SLURM_CPUS_ON_NODE")));
  const int sharing = std::max({1, same_host, slurm_tasks_here(env)});
  return std::max(1, cores / sharing);
}

bool same_host(const std::string& a, const std::string& b) {
  const auto loopback = [](const std::string& h) {
    return h == "localhost" || h == "::1" || h == "[::1]" || h.rfind("127.", 0) == 0;
  };
  return a == b || (loopback(a) && loopback(b));
}

std::vector<int> expand_tasks_per_node(const std::string& s) {
  std::vector<int> out;
  std::size_t pos = 0;
  while (pos < s.size()) {
    std::size_t comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    const std::string part = s.substr(pos, comma - pos);
    const std::size_t paren = part.find("(x");
    if (paren == std::string::npos) {
      out.push_back(parse_count(part, "SLURM_TASKS_PER_NODE"));
    } else {
      if (part.back() != ')') throw error("SLURM_TASKS_PER_NODE: cannot read '" + s + "'");
      const int tasks = parse_count(part.substr(0, paren), "SLURM_TASKS_PER_NODE");
      const int times = parse_count(part.substr(paren + 2, part.size() - paren - 3), "SLURM_TASKS_PER_NODE");
      out.insert(out.end(), static_cast<std::size_t>(times), tasks);
    }
    pos = comma + 1;
  }
  return out;
}

std::vector<node_entry> slurm_nodes(const std::map<std::string, std::string>& env,
                                    const std::vector<std::string>& hostnames, uint16_t base_port) {
  const int ntasks = parse_count(get(env, "SLURM_NTASKS"), "SLURM_NTASKS");
  std::vector<int> per_host = expand_tasks_per_node(get(env, "SLURM_TASKS_PER_NODE"));
  if (per_host.size() != hostnames.size())
    throw error("Slurm: SLURM_TASKS_PER_NODE gives " + std::to_string(per_host.size()) + " hosts, the node list " +
                std::to_string(hostnames.size()));
  std::vector<node_entry> out;
  // Block distribution: the first host's tasks first.
  for (std::size_t h = 0; h < hostnames.size(); ++h)
    for (int k = 0; k < per_host[h]; ++k) {
      node_entry n;
      n.name = "task" + std::to_string(out.size());
      n.host = hostnames[h];
      n.port = static_cast<uint16_t>(base_port + out.size());
      out.push_back(n);
    }
  if (static_cast<int>(out.size()) != ntasks)
    throw error("Slurm: " + std::to_string(out.size()) + " tasks placed on the hosts, SLURM_NTASKS says " +
                std::to_string(ntasks));
  return out;
}

} // namespace troupe::train
