// `train`: trains ResNet per a configuration file and command-line overrides, alone or as one rank
// under mpirun. The only place that catches: errors are logged with the rank and host, the whole
// job is ended, and the exit status tells the launcher what happened (0 done, 1 internal error,
// 2 user error: configuration, data or environment, 3 a deadline passed (a collective or the data
// never came), 128 + signal when stopped by a signal).
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "base/bounded_wait.h"
#include "base/stop_signal.h"
#include "base/user_error.h"
#include "src/config/config.h"
#include "src/data_classes.h"
#include "src/device.h"
#include "src/distributed/liveness.h"
#include "src/distributed/process_group.h"
#include "src/distributed/watchdog.h"
#include "src/environment.h"
#include "src/part_options.h"
#include "src/report/metrics_log.h"
#include "src/run/benchmark.h"
#include "src/run/evaluation.h"
#include "src/run/fit.h"
#include "src/run/plan.h"
#include "src/run/storage_watch.h"
#include "src/sources.h"
#include "src/train/trainer.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

void create_output_dir(const Config& config) {
  std::error_code error;
  fs::create_directories(config.output_dir, error);
  USER_CHECK(!error, "cannot create output_dir '", config.output_dir, "': ", error.message(),
             ". Fix: point output_dir at a writable volume");
}

void write_resolved_config(const Config& config, const std::string& resolved) {
  const fs::path path = fs::path(config.output_dir) / "config.toml";
  std::ofstream out(path);
  USER_CHECK(out, "cannot write ", path, ". Fix: make output_dir writable");
  out << resolved;
}

void report_benchmark(const BenchmarkResult& r, const Config& config, MetricsLog& metrics) {
  spdlog::info(
      "benchmark {} {} batch {}: {:.1f} images/s, step median {:.2f} ms, p90 {:.2f} ms "
      "({} timed steps); a step's mean: forward and backward {:.2f} ms, gradient all-reduce past "
      "backward {:.2f} ms",
      name_of(config.arch), name_of(config.precision), r.batch_size, r.images_per_s,
      r.step_ms_median, r.step_ms_p90, r.steps, r.times.compute_ms, r.times.allreduce_ms);
  metrics.write("benchmark", {{"arch", name_of(config.arch)},
                              {"precision", name_of(config.precision)},
                              {"batch_size", r.batch_size},
                              {"images_per_s", r.images_per_s},
                              {"step_ms_median", r.step_ms_median},
                              {"step_ms_p90", r.step_ms_p90},
                              {"compute_ms", r.times.compute_ms},
                              {"allreduce_ms", r.times.allreduce_ms},
                              {"steps", r.steps}});
}

// With global_batch set: how this world size reaches it (Note [Fixed global batch]).
void log_accumulation(const Config& config) {
  if (config.global_batch == 0) return;
  if (config.cuda_graph && config.micro_batches() > 1)
    spdlog::info(
        "cuda_graph is off for this run: a step is {} micro-batches per rank, and the graph "
        "records a step of one (global_batch <= batch_size x ranks makes it one)",
        config.micro_batches());
  const int64_t micro = config.micro_batch_size();
  const std::string how =
      std::to_string(config.micro_batches()) + " micro-batch(es) of " + std::to_string(micro) +
      " images per rank and step on " + std::to_string(config.world_size) + " rank(s)" +
      (micro < config.batch_size
           ? " (batch_size " + std::to_string(config.batch_size) + " shrunk to fit global_batch)"
           : "");
  if (config.images_per_step() == config.global_batch)
    spdlog::info("global batch {} kept: {}", config.global_batch, how);
  else
    spdlog::warn(
        "global_batch = {} is not a multiple of micro-batch x ranks = {}: steps of {} images, the "
        "nearest below ({}). Fix: a global_batch that every expected world size divides",
        config.global_batch, config.images_per_micro_batch(), config.images_per_step(), how);
}

// Rank 0 logs the world once: hosts, ranks per host, GPUs, and what NCCL chose.
void log_world(const ProcessGroup& group, c10::Device device, const std::string& nccl) {
  std::map<std::string, int> ranks_per_host;
  for (const auto& host : group.hosts()) ++ranks_per_host[host];
  std::string hosts;
  for (const auto& [host, n] : ranks_per_host)
    hosts += (hosts.empty() ? "" : ", ") + host + " x" + std::to_string(n);
  spdlog::info("world: {} rank(s) on {} host(s) [{}]; rank 0 on {}{}", group.size(),
               ranks_per_host.size(), hosts, describe_device(device),
               nccl.empty() ? "" : "; " + nccl);
}

// Log lines that name the host and rank, rank 0 alone speaking below warnings; LibTorch's CPU
// threads sharing the node's cores with its other ranks.
void configure_process(const ProcessGroup& group, const Environment& env) {
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [" + group.host() + " " +
                      std::to_string(group.rank()) + "/" + std::to_string(group.size()) +
                      "] [%^%l%$] %v");
  if (group.rank() != 0) spdlog::set_level(spdlog::level::warn);  // rank 0 speaks for all
  // Under mpirun LibTorch would otherwise start with one thread whatever the cores.
  if (!env.omp_num_threads_set)
    at::set_num_threads(
        static_cast<int>(std::max(1u, std::thread::hardware_concurrency() / group.local_size())));
}

// Joins the job the launcher started, and validates `config` once, at its world size (filled in
// with what else the launcher says of the run).
std::unique_ptr<ProcessGroup> join_job(Config& config, const Environment& env) {
  // Before the rules that need the world size: the process group needs the collective timeout.
  validate_keys(config);
  auto group =
      std::make_unique<ProcessGroup>(env, std::chrono::seconds(config.collective_timeout_s));
  config.world_size = group->size();
  config.restart_count = env.torchrun.restart_count;
  config.elastic = env.launcher == Launcher::kTorchrun;
  validate_config(config);
  return group;
}

// What ends a job that a rank, a host or its file system has left, from here on: the storage watch
// times every call into the data's file system, the watchdog every collective of the group, and
// the liveness messages find a lost host long before that.
struct JobGuards {
  JobGuards(ProcessGroup& group, const Environment& env, const Config& config, c10::Device device)
      : storage(group, std::chrono::seconds(config.storage_timeout_s)) {
    if (group.launched())
      watchdog.emplace(group, std::chrono::seconds(config.collective_timeout_s), device);
    if (group.size() > 1 && config.liveness_timeout_s > 0)
      liveness.emplace(group, env, std::chrono::seconds(config.liveness_timeout_s));
  }
  StorageWatch storage;
  std::optional<Watchdog> watchdog;
  std::optional<Liveness> liveness;
};

// `group` and `guards` outlive run(), so that an error it throws is logged and told to the other
// ranks (fail below) while they still stand.
int run(int argc, char** argv, std::unique_ptr<ProcessGroup>& group,
        std::optional<JobGuards>& guards) {
  std::optional<CommandLine> line = parse_command_line(argc, argv);
  if (!line) return 0;  // --help
  if (line->plan_world_size != 0) {
    std::cout << describe_plan(line->config, line->plan_world_size, line->plan_train_images);
    return 0;
  }
  Config config = line->config;
  const Environment env = read_environment();
  group = join_job(config, env);
  configure_process(*group, env);
  const c10::Device device = select_device(config.device, group->local_rank());
  check_device_supports(config, device, group->launched());
  limit_gpu_memory(device, config.gpu_memory_gib);
  at::globalContext().setBenchmarkCuDNN(config.cudnn_benchmark);
  guards.emplace(*group, env, config, device);
  log_world(*group, device, group->init_nccl(device));
  TrainerOptions trainer_setup = trainer_options(config);
  spdlog::info("resolved configuration:\n{}", trainer_setup.resolved_config);
  if (group->rank() == 0) create_output_dir(config);
  // An evaluation leaves the config.toml of the run that trained in output_dir as it is.
  if (group->rank() == 0 && !config.evaluate_only)
    write_resolved_config(config, trainer_setup.resolved_config);
  const bool reports = group->rank() == 0;  // rank 0 writes the run's metrics and events
  MetricsLog metrics(
      reports ? fs::path(config.output_dir) / "metrics.jsonl" : fs::path(),
      reports && config.tensorboard ? (fs::path(config.output_dir) / "tensorboard").string() : "");
  install_stop_signal_handlers();
  // Before the indexes are built: a names file that does not fit the run stops it at once.
  trainer_setup.classes = find_data_classes(config);

  build_tfrecord_indexes(config, group->local_rank(), group->local_size());
  group->barrier(
      "the barrier after building TFRecord indexes (ranks scanning slow storage: write the "
      "indexes beside the data once with index-tfrecords)");
  Sources sources = make_sources(config, device, group->rank(), group->local_size());
  Trainer trainer(trainer_setup, device, group.get());
  guards->storage.start_up_done();
  if (config.evaluate_only) {
    evaluate_only(trainer, start_options(config), *sources.val, metrics);
    return 0;
  }
  if (config.benchmark) {
    report_benchmark(run_benchmark(trainer, *sources.train, benchmark_options(config)), config,
                     metrics);
    return 0;
  }
  std::optional<SampleTrace> trace;
  if (!env.sample_trace_dir.empty()) trace.emplace(env.sample_trace_dir, group->rank());
  log_accumulation(config);
  FitResult result = fit(trainer, fit_options(config), *sources.train, sources.val.get(), metrics,
                         trace ? &*trace : nullptr);
  if (result.stopped) return 128 + stop_signal_number();
  if (result.final_eval.images > 0)
    spdlog::info("final: top-1 {:.2f}%, top-5 {:.2f}% on {} held-out images after {} steps",
                 result.final_eval.top1(), result.final_eval.top5(), result.final_eval.images,
                 result.steps);
  return 0;
}

// Logs the error with its rank and host, tells the other ranks (Note [A last word],
// src/distributed/liveness.cpp) and, under mpirun, ends every rank of the job (MPI_Abort, NCCL
// abort) so that none is left waiting in a collective.
int fail(const std::unique_ptr<ProcessGroup>& group, std::optional<JobGuards>& guards, int code,
         std::string message, spdlog::level::level_enum level) {
  const std::string where =
      group ? "rank " + std::to_string(group->rank()) + " (" + group->host() + "): " : "";
  // A peer stuck on storage is the likely cause of a collective that failed here.
  const std::string peers = code == 1 || code == 3 ? peers_stuck_on_storage() : "";
  // A library's error after a stop signal: a rank that stopped first closed its connections
  // (Gloo's "Connection closed by peer"). The stop, not a fault, ends this rank.
  if (code == 1 && stop_requested()) {
    code = 128 + stop_signal_number();
    level = spdlog::level::warn;
    message = "signal " + std::to_string(stop_signal_number()) +
              " arrived, and a collective then failed as another rank stopped first (" + message +
              ")";
  }
  spdlog::log(level, "{}{}{}", where, message, peers.empty() ? "" : " (before it: " + peers + ")");
  spdlog::default_logger()->flush();
  // A stop signal reaches every rank, and each stops by itself (a rank may still be writing its
  // checkpoint): this one only leaves (the guards' end says so); any other end is told as a fault.
  bool told = false;
  if (code > 128) {
    guards.reset();
  } else {
    told = tell_peers_this_rank_ends(message.substr(0, message.find('\n')), code, false);
  }
  if (group && group->size() > 1) group->abort_job(code, told);
  return code;
}

}  // namespace
}  // namespace trainer

int main(int argc, char** argv) {
  std::unique_ptr<trainer::ProcessGroup> group;  // outlives run(): the handlers below abort it
  std::optional<trainer::JobGuards> guards;      // destroyed first, as run()'s locals were
  try {
    return trainer::run(argc, argv, group, guards);
  } catch (const trainer::UserError& e) {
    return trainer::fail(group, guards, 2, e.what(), spdlog::level::err);
  } catch (const trainer::StopRequested& e) {  // stopped while waiting, without a checkpoint
    return trainer::fail(group, guards, 128 + trainer::stop_signal_number(), e.what(),
                         spdlog::level::warn);
  } catch (const trainer::DeadlineExceeded& e) {
    return trainer::fail(group, guards, 3,
                         std::string(e.what()) +
                             ". HINT: a read of the data that does not return (storage) or "
                             "decoding too slow for the deadline (raise collective_timeout_s)",
                         spdlog::level::critical);
  } catch (const c10::OutOfMemoryError& e) {  // the run's settings, not a fault: a user error
    return trainer::fail(
        group, guards, 2,
        std::string("the GPU has not the memory this run needs: ") + e.what_without_backtrace() +
            "\nFix: a smaller batch_size with global_batch kept (micro-batches make the same "
            "step), cuda_graph = false, smaller images (image_size, val_image_size), or a card "
            "with more memory",
        spdlog::level::err);
  } catch (const c10::Error& e) {  // LibTorch's own check failed: its message without a backtrace
    return trainer::fail(group, guards, 1,
                         std::string("internal error: ") + e.what_without_backtrace(),
                         spdlog::level::critical);
  } catch (const std::exception& e) {
    return trainer::fail(group, guards, 1, std::string("internal error: ") + e.what(),
                         spdlog::level::critical);
  }
}
