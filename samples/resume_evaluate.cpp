// resume_evaluate: a run that checkpoints, is continued later from its
// checkpoint, and whose checkpoint is evaluated on its own.
//   resume_evaluate DIR       the checkpoint goes to DIR/mlp.ckpt
//   resume_evaluate DIR 100   at most 100 steps per run
#include <cstdlib>
#include <iostream>
#include <string>

#include <troupe/troupe.hpp>

namespace {

const char* const usage_text =
    "usage: resume_evaluate DIR [MAX_STEPS]\n"
    "Trains an MLP with ASGD on 2 workers for one epoch (or MAX_STEPS updates),\n"
    "checkpointing to DIR/mlp.ckpt, goes on from the checkpoint for a second\n"
    "epoch, then evaluates the checkpoint on its own.\n"
    "\n"
    "options:\n"
    "  -h, --help                print this text and exit\n"
    "  --version                 print \"resume_evaluate VERSION\" and exit\n";

} // namespace

int main(int argc, char** argv) {
  using namespace troupe;
  if (train::help_or_version(argc, argv, usage_text, std::cout)) return 0;
  char* end = nullptr;
  const long max_steps = argc > 2 ? std::strtol(argv[2], &end, 10) : 0;
  if (argc < 2 || argc > 3 || argv[1][0] == '-' ||
      (argc > 2 && (*end != '\0' || max_steps < 0 || argv[2][0] == '\0'))) {
    std::cerr << "resume_evaluate: expected DIR [MAX_STEPS]\n" << usage_text;
    return 2;
  }
  const std::string checkpoint = std::string(argv[1]) + "/mlp.ckpt";
  auto j = job()
               .model([] { return zoo::mlp(); }, "mlp")
               .data(data::fashion_mnist())
               .algorithm(asgd().workers(2))
               .checkpoint(checkpoint)  // resumed from when it exists, written after every epoch
               .max_steps(max_steps);
  try {
    // The first run: one epoch (or max_steps), then the checkpoint is written.
    fit(j.epochs(1));
    // Later, the same job with more epochs goes on from the checkpoint.
    history h = fit(j.epochs(2).max_steps(max_steps ? 2 * max_steps : 0));
    std::cout << "the second run trained " << h.size() << " epoch(s)\n";
    // The checkpoint on its own: the model's accuracy and loss on the test set.
    evaluation e = evaluate(j, checkpoint);
    std::cout << "checkpoint after " << e.epochs << " epoch(s), " << e.steps << " steps: test accuracy "
              << e.test_accuracy << ", test loss " << e.test_loss << "\n";
  } catch (const std::exception& e) {
    std::cerr << "resume_evaluate: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
