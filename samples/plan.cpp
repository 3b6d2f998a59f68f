// troupe_plan: prints the plan of a job without training it. It takes the
// trainer's options (or a job file) and --json; for a pipeline, each stage's
// layers, device, predicted forward/backward/transfer time and memory, the
// predicted step time and the bottleneck.
//   troupe_plan --model cnn --pipeline-stages 4 --device-speeds 1,1,2,4 --placement greedy
//   troupe_plan --config job.toml --placement optimal --json
#include <cstring>
#include <iostream>
#include <vector>

#include <troupe/troupe.hpp>

int main(int argc, char** argv) {
  using namespace troupe::train;
  bool json = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && std::strcmp(argv[i], "--json") == 0) {
      json = true;
      continue;
    }
    args.push_back(argv[i]);
  }
  command_line cl;
  try {
    cl = parse_command_line(static_cast<int>(args.size()), args.data(), "troupe_plan");
    if (cl.help) {
      usage_options u;
      u.synopsis += " [--json]";
      u.about =
          "Prints the plan of the job the options describe (the trainer's options), without training: the "
          "actors on each node and, for a pipeline (--pipeline-stages K), each stage's layers, device, predicted "
          "times and memory, the predicted step time and the bottleneck.";
      u.extra_options = {{"--json", "print the plan as one JSON object (field predicted_step_s)"}};
      std::cout << usage("troupe_plan", u);
      return 0;
    }
    if (cl.version) {
      std::cout << "troupe_plan " << troupe::version() << "\n";
      return 0;
    }
  } catch (const std::exception& e) {
    std::cerr << "troupe_plan: " << e.what() << "\n";
    return 2;
  }
  try {
    for (const std::string& note : unread_keys(cl.spec)) std::cerr << "note: " << note << "\n";
    std::cout << troupe::describe_plan(make_job(cl.spec).node(cl.node), json);
  } catch (const std::exception& e) {
    std::cerr << "troupe_plan: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
