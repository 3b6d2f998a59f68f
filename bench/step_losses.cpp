// step_losses: the trainer's run (the same options: troupe_trainer's command
// line) with each step's training loss printed, "step LOSS" per line on
// stdout, for loss curves against another framework's (bench/lm_curve.sh).
//   troupe_step_losses --model gpt --seed 2 --progress none
#include <iostream>

#include <troupe/troupe.hpp>

int main(int argc, char** argv) {
  using namespace troupe::train;
  try {
    const command_line cl = parse_command_line(argc, argv);
    if (cl.help) {
      std::cout << "troupe_step_losses: troupe_trainer's options; prints each step's loss\n" << cl.text;
      return 0;
    }
    troupe::job j = make_job(cl.spec);
    j.on_step([](const troupe::step_event& e) { std::cout << e.step << " " << e.loss << "\n"; });
    troupe::fit(j, std::cerr);
  } catch (const std::exception& e) {
    std::cerr << "troupe_step_losses: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
