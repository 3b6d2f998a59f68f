// troupe_checkpoint: what a checkpoint holds, without loading a model: the
// epochs and steps it records, its entries, and for an asynchronous run each
// parameter shard's version and the digest of its update rule's state (the
// same digest a resumed shard logs, so that a restore can be checked).
//   troupe_checkpoint run.ckpt
#include <iostream>
#include <string>

#include <troupe/troupe.hpp>

namespace {

const char* const usage_text =
    "usage: troupe_checkpoint FILE\n"
    "Prints what the checkpoint FILE holds, without loading a model: the epochs\n"
    "and steps it records, its tensors' digest, and for an asynchronous run each\n"
    "parameter shard's version and the digest of its update rule's state.\n"
    "A FILE whose name starts with '-' is given as ./-name.\n"
    "\n"
    "options:\n"
    "  -h, --help                print this text and exit\n"
    "  --version                 print \"troupe_checkpoint VERSION\" and exit\n";

} // namespace

int main(int argc, char** argv) {
  using namespace troupe;
  if (train::help_or_version(argc, argv, usage_text, std::cout)) return 0;
  if (argc != 2 || argv[1][0] == '-') {
    if (argc == 2) std::cerr << "troupe_checkpoint: unknown option " << argv[1] << " (see --help)\n";
    std::cerr << usage_text;
    return 2;
  }
  try {
    const net::checkpoint c = net::load_checkpoint(argv[1]);
    std::cout << "architecture: " << c.architecture << "\n"
              << "epochs done: " << c.epoch << "\nsteps: " << c.step << "\n"
              << "parameters and buffers: " << c.params.size() << " tensors, digest " << std::hex
              << net::state_digest(c.params) << std::dec << "\n"
              << "optimizer or rule: " << c.optimizer_kind << "\n";
    if (!c.vocabulary.empty())
      std::cout << "vocabulary: " << c.vocabulary.size()
                << " bytes (a language model's: troupe_generate continues text with it)\n";
    for (uint32_t s = 0; s < c.shard_versions.size(); ++s)
      std::cout << "shard " << s << ": version " << c.shard_versions[s] << ", rule state digest " << std::hex
                << net::state_digest(net::shard_state(c, s)) << std::dec << "\n";
  } catch (const std::exception& e) {
    std::cerr << "troupe_checkpoint: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
