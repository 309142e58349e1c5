// `train`: trains ResNet per a configuration file and command-line overrides. The only place that
// catches: errors are logged with the host, and the exit status tells the launcher what happened
// (0 done, 1 internal error, 2 user error: configuration, data or environment, 143 stopped).
#include <ATen/Context.h>
#include <c10/util/Exception.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>

#include "src/benchmark.h"
#include "src/check.h"
#include "src/config.h"
#include "src/device.h"
#include "src/environment.h"
#include "src/fit.h"
#include "src/metrics_log.h"
#include "src/sources.h"
#include "src/stop_signal.h"
#include "src/trainer.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

void write_resolved_config(const Config& config) {
  std::error_code error;
  fs::create_directories(config.output_dir, error);
  USER_CHECK(!error, "cannot create output_dir '", config.output_dir, "': ", error.message(),
             ". Fix: point output_dir at a writable volume");
  const fs::path path = fs::path(config.output_dir) / "config.toml";
  std::ofstream out(path);
  USER_CHECK(out, "cannot write ", path, ". Fix: make output_dir writable");
  out << config_to_toml(config);
}

void report_benchmark(const BenchmarkResult& r, const Config& config, MetricsLog& metrics) {
  spdlog::info(
      "benchmark {} {} batch {}: {:.1f} images/s, step median {:.2f} ms, p90 {:.2f} ms "
      "({} timed steps)",
      config.arch, config.precision, r.batch_size, r.images_per_s, r.step_ms_median, r.step_ms_p90,
      r.steps);
  metrics.write("benchmark", {{"arch", config.arch},
                              {"precision", config.precision},
                              {"batch_size", r.batch_size},
                              {"images_per_s", r.images_per_s},
                              {"step_ms_median", r.step_ms_median},
                              {"step_ms_p90", r.step_ms_p90},
                              {"steps", r.steps}});
}

int run(int argc, char** argv) {
  std::optional<Config> parsed = parse_config(argc, argv);
  if (!parsed) return 0;  // --help
  const Config& config = *parsed;
  const Environment env = read_environment();
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [" + env.hostname + "] [%^%l%$] %v");

  const c10::Device device = select_device(config.device, env.local_rank);
  check_precision_supported(config.precision, device);
  at::globalContext().setBenchmarkCuDNN(config.cudnn_benchmark);
  spdlog::info("device {} (local rank {} from {})", describe_device(device), env.local_rank,
               env.local_rank_source);
  spdlog::info("resolved configuration:\n{}", config_to_toml(config));
  write_resolved_config(config);
  MetricsLog metrics(fs::path(config.output_dir) / "metrics.jsonl");
  install_stop_signal_handlers();

  Sources sources = make_sources(config, device);
  Trainer trainer(config, device);
  if (config.benchmark) {
    report_benchmark(run_benchmark(trainer, *sources.train, config), config, metrics);
    return 0;
  }
  FitResult result = fit(trainer, config, *sources.train, sources.val.get(), metrics);
  if (result.stopped) return 128 + stop_signal_number();
  if (result.final_eval.images > 0)
    spdlog::info("final: top-1 {:.2f}%, top-5 {:.2f}% on {} held-out images after {} steps",
                 result.final_eval.top1(), result.final_eval.top5(), result.final_eval.images,
                 result.steps);
  return 0;
}

}  // namespace
}  // namespace trainer

int main(int argc, char** argv) {
  try {
    return trainer::run(argc, argv);
  } catch (const trainer::UserError& e) {
    spdlog::error("{}", e.what());
    return 2;
  } catch (const c10::Error& e) {  // LibTorch's own check failed: its message without a backtrace
    spdlog::critical("internal error: {}", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    spdlog::critical("internal error: {}", e.what());
    return 1;
  }
}
