// troupe_generate: continues a prompt with a language model that
// troupe_trainer --model gpt trained (its checkpoint holds the vocabulary).
//   troupe_generate --checkpoint gpt.ckpt --prompt "Q: " --tokens 300 --temperature 0.8 --top-k 20 --seed 7
#include <chrono>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <string>

#include <troupe/troupe.hpp>

namespace {

const char* const usage_text =
    "usage: troupe_generate --checkpoint FILE [--prompt TEXT] [--tokens N]\n"
    "                       [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
    "                       [--threads N] [--cache true|false] [--window-shift N]\n"
    "Prints the prompt and its continuation by the language model of FILE (a\n"
    "troupe_trainer --model gpt checkpoint), each token as it is drawn: the same\n"
    "seed gives the same text.\n"
    "\n"
    "options:\n"
    "  --checkpoint FILE         the checkpoint to read (required)\n"
    "  --prompt TEXT             the text to continue (default: none)\n"
    "  --tokens N                characters to add (default 200)\n"
    "  --temperature T           divide the logits by T; 0: the likeliest (default 1)\n"
    "  --top-k K                 sample among the K likeliest; 0: all (default 0)\n"
    "  --top-p P                 sample among the fewest likeliest tokens that\n"
    "                            hold P of the probability; 1: all (default 1)\n"
    "  --seed S                  the sampler's seed (default 1)\n"
    "  --threads N               CPU threads; 0: every CPU it may use (default 1)\n"
    "  --cache B                 keep the attention's keys and values: a token\n"
    "                            costs one position, not the window (default true)\n"
    "  --window-shift N          past the context, move the window on by N tokens:\n"
    "                            1 reads the last context tokens for each token;\n"
    "                            N decodes the window again once every N tokens,\n"
    "                            each token reading context - N + 1 or more\n"
    "                            (default 1)\n"
    "  -h, --help                print this text and exit\n"
    "  --version                 print \"troupe_generate VERSION\" and exit\n";

/// `text` as a number of the option `name`; throws troupe::error when it is not one.
double number(const std::string& name, const std::string& text) {
  char* end = nullptr;
  const double x = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0') throw troupe::error("--" + name + ": expected a number, got '" + text + "'");
  return x;
}

/// Reads `--name value` and `--name=value` into `path` and `o`.
void parse(int argc, char** argv, std::string& path, troupe::generate_options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i], value;
    if (arg.rfind("--", 0) != 0) throw troupe::error("unexpected argument '" + arg + "' (see --help)");
    const std::size_t eq = arg.find('=');
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      throw troupe::error(arg + " needs a value (see --help)");
    }
    const std::string name = arg.substr(2);
    if (name == "checkpoint") path = value;
    else if (name == "prompt") o.prompt = value;
    else if (name == "tokens") o.tokens = static_cast<int64_t>(number(name, value));
    else if (name == "temperature") o.temperature = static_cast<float>(number(name, value));
    else if (name == "top-k") o.top_k = static_cast<int64_t>(number(name, value));
    else if (name == "top-p") o.top_p = static_cast<float>(number(name, value));
    else if (name == "seed") o.seed = static_cast<uint64_t>(number(name, value));
    else if (name == "threads") o.threads = static_cast<int>(number(name, value));
    else if (name == "cache" && (value == "true" || value == "false")) o.cache = value == "true";
    else if (name == "window-shift") o.window_shift = static_cast<int64_t>(number(name, value));
    else if (name == "cache") throw troupe::error("--cache: expected true or false, got '" + value + "'");
    else throw troupe::error("unknown option " + arg + " (see --help)");
  }
  if (path.empty()) throw troupe::error("--checkpoint FILE is required (see --help)");
}

} // namespace

int main(int argc, char** argv) {
  if (troupe::train::help_or_version(argc, argv, usage_text, std::cout)) return 0;
  std::string path;
  troupe::generate_options o;
  try {
    parse(argc, argv, path, o);
  } catch (const std::exception& e) {
    std::cerr << "troupe_generate: " << e.what() << "\n";
    return 2;
  }
  try {
    using clock = std::chrono::steady_clock;
    const clock::time_point start = clock::now();
    clock::time_point first, last;
    int64_t drawn = 0;
    o.on_token = [&](const std::string& piece) {  // each token as it is drawn; the prompt with the first
      std::cout << (drawn == 0 ? o.prompt : "") << piece << std::flush;
      (drawn++ == 0 ? first : last) = clock::now();
    };
    troupe::generate(path, o);
    std::cout << (drawn == 0 ? o.prompt : "") << "\n";
    const auto seconds = [](clock::duration d) { return std::chrono::duration<double>(d).count(); };
    if (drawn > 1)  // on stderr, apart from the text
      std::cerr << "troupe_generate: " << drawn << " tokens, " << std::setprecision(3)
                << seconds(last - first) * 1e3 / static_cast<double>(drawn - 1) << " ms a token after the first ("
                << seconds(first - start) << " s to load the checkpoint and draw the first)\n";
  } catch (const std::exception& e) {
    std::cerr << "troupe_generate: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
