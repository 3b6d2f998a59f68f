#include "train/evaluate.hpp"

#include <ostream>

#include "kernels/kernels.hpp"
#include "net/checkpoint.hpp"
#include "train/loop.hpp"
#include "train/plan.hpp"

namespace troupe {

evaluation evaluate(const job& j, const std::string& path, std::ostream& log) {
  j.validate();
  const settings& s = j.config();
  // threads = 0: this process's share of the cores (Slurm's CPUs per task), as the loop takes, not every core.
  kernels::context ctx = kernels::context::with_threads(train::topology::local(s.threads).nodes[0].threads);
  ctx.gemm = s.gemm;
  const train::loaded_data d = train::load_data(j, log);
  model::model net = train::build_model(j, d, true);
  const net::checkpoint c = net::load_checkpoint(path);
  train::check_vocabulary(path, c.vocabulary, d);
  net.load_state(c.architecture, c.params);
  const train::test_score t = d.text ? train::score_text(net, ctx, *d.text, d.text->parts.test, s.batch_size)
                                     : train::score(net, ctx, d.sets.test, d.norm, s.batch_size);
  evaluation e;
  e.epochs = c.epoch;
  e.steps = c.step;
  e.test_accuracy = t.accuracy;
  e.test_loss = t.loss;
  e.samples = t.samples;
  return e;
}

} // namespace troupe
