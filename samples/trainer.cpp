// troupe_trainer: trains a zoo model (mlp, cnn or resnet) on Fashion-MNIST or other IDX
// data, in one plain loop or on actors, as a job file and the options say; or
// a character-level language model (gpt) on text in the plain loop.
//   troupe_trainer --model=cnn --epochs=5 --metrics-out=run.jsonl
//   troupe_trainer --model gpt --checkpoint gpt.ckpt     (then troupe_generate --checkpoint gpt.ckpt)
//   troupe_trainer --algorithm ddc-asgd --workers 4 --dump-config > job.toml
//   troupe_trainer --config job.toml --epochs 1
//   troupe_trainer --config cluster.toml --node b    (one node of a cluster: see README)
#include <filesystem>
#include <iostream>
#include <string>

#include <troupe/troupe.hpp>

namespace {

// One line per output the run wrote ("metrics: /abs/run.jsonl"): those the job
// names and this process wrote (on a cluster, node 0 writes them).
void name_outputs(const troupe::settings& s, std::ostream& log) {
  namespace fs = std::filesystem;
  const std::pair<const char*, const std::string*> outputs[] = {
      {"metrics", &s.metrics_out}, {"checkpoint", &s.checkpoint}, {"trace", &s.trace}};
  for (const auto& [what, path] : outputs) {
    std::error_code ec;
    if (path->empty() || !fs::exists(*path, ec)) continue;
    const fs::path absolute = fs::absolute(*path, ec);
    log << what << ": " << (ec ? *path : absolute.string()) << "\n";
  }
}

} // namespace

int main(int argc, char** argv) {
  using namespace troupe::train;
  command_line cl;
  try {
    cl = parse_command_line(argc, argv);
    if (cl.help) {
      std::cout << cl.text;
      return 0;
    }
    if (cl.version) {
      std::cout << "troupe_trainer " << troupe::version() << "\n";
      return 0;
    }
    if (cl.dump_config) {
      std::cout << to_job_file(cl.spec);
      return 0;
    }
  } catch (const std::exception& e) {
    std::cerr << "troupe_trainer: " << e.what() << "\n";
    return 2;
  }
  try {
    std::cerr << "troupe_trainer " << troupe::version() << ", kernels " << troupe::kernels::cpu_kernels_name()
              << (troupe::kernels::cpu().full_rate_avx512 ? " (512-bit FMAs at full rate)" : "") << "\n";
    for (const std::string& note : unread_keys(cl.spec)) std::cerr << "note: " << note << "\n";
    troupe::fit(make_job(cl.spec).node(cl.node), std::cerr);
  } catch (const std::exception& e) {
    // The exit status says the kind of failure (--help lists them): a script or
    // a scheduler can requeue after a lost node and not after a diverged run.
    const troupe::failure f = troupe::failure_of(e);
    std::cerr << "\ntroupe_trainer: error" << (f == troupe::failure::other ? "" : std::string(" (") + troupe::to_string(f) + ")")
              << ": " << e.what() << "\n";  // after a progress bar's unfinished line
    const troupe::settings& t = cl.spec.train;
    if (std::string(e.what()).find("out of memory: a tensor") != std::string::npos && !troupe::runs_on_actors(t) &&
        t.batch_size >= 4)  // the same steps on batches a quarter the size
      std::cerr << "note: --batch-size " << t.batch_size / 4 << " --accumulate " << 4 * t.accumulate
                << " trains on " << t.batch_size / 4 * 4 * t.accumulate
                << " samples a step, as now, with the activations of a batch a quarter the size\n";
    return troupe::exit_status(f);
  }
  name_outputs(cl.spec.train, std::cerr);
  return 0;
}
