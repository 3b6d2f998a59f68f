#pragma once

// The nodes of a run, as a job file's [cluster] table describes them, and
// which of them this process is: from --node, or from Slurm's environment.
// Pure: the same description gives every node the same topology.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "train/cluster_spec.hpp"
#include "train/plan.hpp"

namespace troupe::train {

/// Throws troupe::error naming the first problem: duplicate names or
/// host:port pairs, a port of 0, a bad timeout, no secret file with several nodes.
void validate(const cluster_spec& c);

/// The topology the plan is computed on. A node's threads of 0 become, for
/// this node, `local_threads` (the job's `threads`) when > 0, else its share of
/// the host: default_threads(env, cores less the threads of the nodes on the
/// same host that set theirs, those that do not); for other nodes 1 (a node
/// knows only its own cores; the plan's roles do not depend on threads).
topology topology_of(const cluster_spec& c, uint32_t self, int local_threads,
                     const std::map<std::string, std::string>& env, int cores);
/// topology_of() with this process's environment and usable_cores().
topology topology_of(const cluster_spec& c, uint32_t self, int local_threads);

/// The CPUs this process may run on: its affinity mask (what taskset, a
/// cpuset or Slurm's binding leave it), else the host's cores; at least 1.
int usable_cores();
/// For the log: a note when `threads` (this process's kernel threads) exceeds usable_cores(): the
/// threads then take turns on the cores, and every parallel region waits for the one that is
/// not running (docs/benchmarks.md measured --threads 2 on one free core at half the speed of
/// --threads 1). "" otherwise.
std::string oversubscription_note(int threads);
/// oversubscription_note() against `cores` CPUs.
std::string oversubscription_note(int threads, int cores);
/// For node `self`'s log: a note when the threads of the job's node processes on its host (the
/// nodes whose host is the same, same_host()) exceed the CPUs it may use, and one thread per
/// process (the least they can take, what the default gives more processes than CPUs). Each such node counts
/// its own `threads`, else the job's (`job_threads` > 0, which every node of the job takes), else
/// its share of the host. One process on the host: oversubscription_note(). "" otherwise. (Nodes
/// in network namespaces have addresses of their own: they are not seen as one host.)
std::string host_threads_note(const cluster_spec& c, uint32_t self, int job_threads,
                              const std::map<std::string, std::string>& env, int cores);
/// host_threads_note() with this process's environment and usable_cores().
std::string host_threads_note(const cluster_spec& c, uint32_t self, int job_threads);

/// Slurm's tasks on this process's host: SLURM_NTASKS_PER_NODE when set, else
/// the entry of SLURM_TASKS_PER_NODE for SLURM_NODEID (the most of any host
/// without SLURM_NODEID); 0 outside Slurm. Throws troupe::error for a value it
/// cannot read.
int slurm_tasks_here(const std::map<std::string, std::string>& env);

/// The threads a process takes where neither the job nor its node sets
/// `threads`: SLURM_CPUS_PER_TASK when Slurm sets it; else `cores` (the CPUs
/// it may run on; no more than SLURM_CPUS_ON_NODE, the job's CPUs on this
/// host) shared evenly by the processes on its host, Slurm's tasks there or
/// `same_host` (the job file's nodes there), whichever is more. At least 1.
int default_threads(const std::map<std::string, std::string>& env, int cores, int same_host = 1);

/// Whether two [cluster] hosts are the same machine: the same name or
/// address, or both loopback (localhost, 127.0.0.0/8, ::1).
bool same_host(const std::string& a, const std::string& b);

/// Which node this process is: `node_name` when given (a name of the
/// cluster), else Slurm's SLURM_PROCID, else node 0 of a one-node cluster.
/// Throws troupe::error for an unknown name, or a cluster of several nodes with
/// neither --node nor Slurm.
uint32_t self_index(const cluster_spec& c, const std::string& node_name, const std::map<std::string, std::string>& env);

/// A cluster of Slurm's tasks: task i is node "task<i>" on the host that
/// Slurm's block distribution gives it (SLURM_TASKS_PER_NODE over the
/// expanded node list), listening on slurm_port + i. `hostnames` is
/// SLURM_JOB_NODELIST expanded (`scontrol show hostnames`). Throws
/// troupe::error when the environment does not describe the tasks.
std::vector<node_entry> slurm_nodes(const std::map<std::string, std::string>& env,
                                    const std::vector<std::string>& hostnames, uint16_t base_port);

/// SLURM_JOB_NODELIST expanded by `scontrol show hostnames`; throws
/// troupe::error when scontrol fails or is missing.
std::vector<std::string> slurm_hostnames(const std::string& nodelist);

/// The environment of this process (for self_index and slurm_nodes).
std::map<std::string, std::string> environment();

/// `c` as this process runs it: under srun with several tasks and no nodes
/// listed, the nodes Slurm gives (slurm_nodes); else `c` itself.
cluster_spec resolve(const cluster_spec& c, const std::map<std::string, std::string>& env);

/// "2(x3),1" -> {2, 2, 2, 1}: SLURM_TASKS_PER_NODE's tasks per host.
std::vector<int> expand_tasks_per_node(const std::string& s);

} // namespace troupe::train
