// bench-step: the training step of several configurations in one process, alternated, so that a
// short GPU session can say which keys make the step faster before they become defaults.
//   bench-step --repeats 3 --trial "defaults=" --trial "graph=--cuda_graph true" \
//     -- --config configs/one-gpu.toml --data_source synthetic --precision bf16 --batch_size 256
// Each trial is `train`'s command line after `--` with its own keys added, built and timed as
// `train --benchmark true` does (run_benchmark: warm-up, then CUDA events read once); round r runs
// every trial once, starting from the r-th, and a trial's figure is its median over the rounds
// (scripts/bench/train.sh runs a round a process, alternated with PyTorch's: --first_round).
// One process saves each measurement `train`'s start (LibTorch, the CUDA context, cuDNN's
// autotuning, which its cache keeps for every later trial of the same shapes): a few seconds of
// a short device session each. The summary compares each trial with the first round by round.
#include <ATen/Context.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "base/user_error.h"
#include "src/config/config.h"
#include "src/device.h"
#include "src/part_options.h"
#include "src/run/benchmark.h"
#include "src/sources.h"
#include "src/tools/tool_main.h"
#include "src/train/trainer.h"

namespace trainer {
namespace {

struct Trial {
  std::string label;
  std::vector<std::string> keys;  // added to the shared command line
  std::vector<double> images_per_s, median_ms;
  std::string failure;  // why its last measurement failed; it is not measured again
};

struct Options {
  std::vector<std::string> trials;  // "LABEL=KEYS"
  int64_t repeats = 3;
  int64_t first_round = 1;  // of a longer alternation of which this process runs a part
  double budget_s = 0;      // no measurement starts past it; 0: none
};

Trial parse_trial(const std::string& spec) {
  const size_t eq = spec.find('=');
  USER_CHECK(eq != std::string::npos && eq > 0, "--trial '", spec,
             "' has no label. Fix: LABEL=KEYS, e.g. \"graph=--cuda_graph true\"");
  Trial trial{spec.substr(0, eq), {}, {}, {}, {}};
  std::istringstream keys(spec.substr(eq + 1));
  for (std::string word; keys >> word;) trial.keys.push_back(word);
  return trial;
}

// `train`'s configuration of the shared command line plus `keys`, validated for one process.
Config trial_config(const std::vector<std::string>& shared, const std::vector<std::string>& keys) {
  std::vector<const char*> argv{"train"};
  for (const auto& word : shared) argv.push_back(word.c_str());
  for (const auto& word : keys) argv.push_back(word.c_str());
  std::optional<CommandLine> line = parse_command_line(static_cast<int>(argv.size()), argv.data());
  USER_CHECK(line, "--help is not a trial's key");
  Config config = line->config;
  USER_CHECK(config.data_source == DataSource::kSynthetic,
             "bench-step measures the step alone. Fix: --data_source synthetic after --");
  validate_keys(config);
  config.world_size = 1;
  validate_config(config);
  return config;
}

// One trial's step, built and timed as `train --benchmark true` builds and times it.
BenchmarkResult measure(const Config& config) {
  const c10::Device device = select_device(config.device, 0);
  check_device_supports(config, device, /*launched=*/false);
  limit_gpu_memory(device, config.gpu_memory_gib);
  at::globalContext().setBenchmarkCuDNN(config.cudnn_benchmark);
  Sources sources = make_sources(config, device);
  Trainer trainer(trainer_options(config), device);
  return run_benchmark(trainer, *sources.train, benchmark_options(config));
}

// LibTorch's messages go on with a backtrace; the first line says what failed.
std::string first_line(const std::string& message) { return message.substr(0, message.find('\n')); }

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// Each trial's median and spread, and in how many rounds it beat the first trial (paired: the
// rounds ran side by side, so a card's drift touches both alike).
void summarise(const std::vector<Trial>& trials) {
  const Trial& reference = trials.front();
  for (const Trial& t : trials) {
    if (!t.failure.empty()) {
      std::printf("bench-step %s: failed: %s\n", t.label.c_str(), t.failure.c_str());
      continue;
    }
    if (t.images_per_s.empty()) {
      std::printf("bench-step %s: not measured (the budget ran out)\n", t.label.c_str());
      continue;
    }
    const auto [low, high] = std::minmax_element(t.images_per_s.begin(), t.images_per_s.end());
    std::printf("bench-step %s: median %.1f images/s, step median %.2f ms, %zu run(s), %.1f-%.1f",
                t.label.c_str(), median(t.images_per_s), median(t.median_ms), t.images_per_s.size(),
                *low, *high);
    const size_t paired = std::min(t.images_per_s.size(), reference.images_per_s.size());
    if (&t != &reference && paired > 0) {
      size_t wins = 0;
      for (size_t r = 0; r < paired; ++r) wins += t.images_per_s[r] > reference.images_per_s[r];
      std::printf("; %.3fx %s, faster in %zu of %zu rounds",
                  median(t.images_per_s) / median(reference.images_per_s), reference.label.c_str(),
                  wins, paired);
    }
    std::printf("\n");
  }
}

// Measures `trial` once, as round `round`, and says so; one that fails (a graph cuDNN cannot
// build, memory) is said and left out of the later rounds, so that it does not cost a short device
// session the other trials' figures.
void measure_once(Trial& trial, const Config& config, int64_t round,
                  const std::function<double()>& elapsed_s) {
  BenchmarkResult r;
  try {
    r = measure(config);
  } catch (const std::exception& e) {
    trial.failure = first_line(e.what());
    std::printf("bench-step %s round %lld failed: %s\n", trial.label.c_str(),
                static_cast<long long>(round), trial.failure.c_str());
    return;
  }
  trial.images_per_s.push_back(r.images_per_s);
  trial.median_ms.push_back(r.step_ms_median);
  std::printf(
      "bench-step %s round %lld: %.1f images/s, step median %.2f ms, p90 %.2f ms (%lld timed "
      "steps, %.0f s in)\n",
      trial.label.c_str(), static_cast<long long>(round), r.images_per_s, r.step_ms_median,
      r.step_ms_p90, static_cast<long long>(r.steps), elapsed_s());
  std::fflush(stdout);
}

int run(const Options& o, const std::vector<std::string>& shared) {
  USER_CHECK(!o.trials.empty(), "no --trial given. Fix: --trial \"LABEL=KEYS\" for each one");
  std::vector<Trial> trials;
  std::vector<Config> configs;
  const std::string defaults = config_to_toml(trial_config(shared, {}));
  for (const auto& spec : o.trials) {
    trials.push_back(parse_trial(spec));
    configs.push_back(trial_config(shared, trials.back().keys));  // every one checked up front
    if (config_to_toml(configs.back()) == defaults)  // what `train` runs without the keys
      std::printf("bench-step %s: the defaults (its keys change nothing)\n",
                  trials.back().label.c_str());
  }
  const auto start = std::chrono::steady_clock::now();
  auto elapsed_s = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const size_t n = trials.size();
  bool spent = false;
  for (int64_t round = o.first_round - 1; round < o.first_round - 1 + o.repeats && !spent;
       ++round) {
    // Each round starts one trial later, so that a round's first place (a cool card) and its last
    // do not always fall to the same trial.
    for (size_t i = 0; i < n && !spent; ++i) {
      const size_t k = (round + i) % n;
      const bool first = round == o.first_round - 1 && i == 0;
      spent = !first && o.budget_s > 0 && elapsed_s() > o.budget_s;
      if (spent)
        std::printf("bench-step: the %g s budget is spent in round %lld\n", o.budget_s,
                    static_cast<long long>(round + 1));
      else if (trials[k].failure.empty())
        measure_once(trials[k], configs[k], round + 1, elapsed_s);
    }
  }
  summarise(trials);
  const bool failed =
      std::any_of(trials.begin(), trials.end(), [](const Trial& t) { return !t.failure.empty(); });
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace trainer

int main(int argc, char** argv) {
  // The tool's own options, then `--` and train's command line, shared by every trial.
  int split = argc;
  for (int i = 1; i < argc && split == argc; ++i)
    if (std::string(argv[i]) == "--") split = i;
  std::vector<std::string> shared(argv + std::min(split + 1, argc), argv + argc);
  trainer::Options o;
  CLI::App app{"The training step of several configurations, alternated in one process",
               "bench-step"};
  app.add_option("--trial", o.trials, "LABEL=KEYS: train's keys of one configuration (repeatable)")
      ->required();
  app.add_option("--repeats", o.repeats, "rounds, each running every trial once")
      ->check(CLI::PositiveNumber);
  app.add_option("--first_round", o.first_round,
                 "the first round's number, where a longer alternation runs a round a process")
      ->check(CLI::PositiveNumber);
  app.add_option("--budget_s", o.budget_s, "no measurement starts past this many seconds (0: none)")
      ->check(CLI::NonNegativeNumber);
  app.footer("After the options: -- and train's command line (--config FILE --key value ...)");
  return trainer::run_tool(app, split, argv, [&] { return trainer::run(o, shared); });
}
