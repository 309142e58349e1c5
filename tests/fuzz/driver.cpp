// Runs a fuzz target without libFuzzer, for builds with g++ (scripts/fuzz.sh runs the targets
// under libFuzzer with clang): every file of the given corpus folders once (the seeds and the
// regression inputs of past findings), then, for --seconds, inputs made from them by a few
// random edits (bytes changed, inserted, removed, the input cut or two spliced), from a fixed
// seed so that a failure repeats.
//   fuzz_<target> [--seconds S] FOLDER_OR_FILE...
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void run(const std::string& input) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

std::string mutate(std::string input, const std::vector<std::string>& corpus,
                   std::mt19937_64& rng) {
  for (int edits = 1 + rng() % 4; edits > 0; --edits) {
    const size_t at = input.empty() ? 0 : rng() % input.size();
    switch (rng() % 5) {
      case 0:
        if (!input.empty()) input[at] = static_cast<char>(rng());
        break;
      case 1:
        input.insert(at, 1 + rng() % 8, static_cast<char>(rng()));
        break;
      case 2:
        input.erase(at, 1 + rng() % 8);
        break;
      case 3:
        input.resize(at);
        break;
      default: {
        const std::string& other = corpus[rng() % corpus.size()];
        input = input.substr(0, at) + other.substr(other.empty() ? 0 : rng() % other.size());
      }
    }
  }
  return input;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 0;
  std::vector<std::string> corpus;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
      continue;
    }
    const std::filesystem::path path(argv[i]);
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(path)) {
      for (const auto& entry : std::filesystem::directory_iterator(path))
        if (entry.is_regular_file()) files.push_back(entry.path());
    } else {
      files.push_back(path);
    }
    std::sort(files.begin(), files.end());  // a fixed order: a failure repeats
    for (const auto& file : files) corpus.push_back(read_file(file));
  }
  if (corpus.empty()) {
    std::fprintf(stderr, "usage: %s [--seconds S] FOLDER_OR_FILE... (found no input)\n", argv[0]);
    return 2;
  }
  for (const std::string& input : corpus) run(input);
  std::mt19937_64 rng(1234);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int64_t mutated = 0;
  for (; std::chrono::steady_clock::now() < end; ++mutated)
    run(mutate(corpus[rng() % corpus.size()], corpus, rng));
  std::printf("%zu corpus inputs and %lld mutated inputs without a failure\n", corpus.size(),
              static_cast<long long>(mutated));
  return 0;
}
