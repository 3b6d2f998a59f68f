// troupe::fit: the sequential loop, or this process as a node of the job's
// cluster (a cluster of one by default).

#include "actors/fit.hpp"

#include "actors/node_run.hpp"
#include "train/bootstrap.hpp"
#include "train/cluster.hpp"

namespace troupe {

std::string describe_plan(const job& j, bool json) { return train::describe_plan(j, json); }

history fit(const job& j, std::ostream& log) {
  j.validate();
  const auto env = train::environment();
  const train::cluster_spec c = train::resolve(j.cluster_config(), env);
  const bool on_actors = runs_on_actors(j.config());
  if (!on_actors && !c.single_process())
    throw error("a cluster of " + std::to_string(c.nodes.size()) +
                " nodes needs an algorithm on actors (e.g. --algorithm asgd); sequential runs in one process");
  if (!on_actors) return train::run_sequential(j, log);
  return actors::run_node(j, c, c.single_process() ? 0 : train::self_index(c, j.node_name(), env), log);
}

} // namespace troupe
