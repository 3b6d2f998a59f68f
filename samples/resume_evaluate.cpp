// resume_evaluate: a run that checkpoints, is continued later from its
// checkpoint, and whose checkpoint is evaluated on its own.
//   resume_evaluate DIR       the checkpoint goes to DIR/mlp.ckpt
//   resume_evaluate DIR 100   at most 100 steps per run
#include <cstdlib>
#include <iostream>
#include <string>

#include <troupe/troupe.hpp>

int main(int argc, char** argv) {
  using namespace troupe;
  if (argc < 2) {
    std::cerr << "usage: resume_evaluate DIR [MAX_STEPS]\n";
    return 2;
  }
  const std::string checkpoint = std::string(argv[1]) + "/mlp.ckpt";
  const long max_steps = argc > 2 ? std::atol(argv[2]) : 0;
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
