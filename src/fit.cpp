#include "src/fit.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <numeric>

#include "src/check.h"
#include "src/lr_schedule.h"
#include "src/stop_signal.h"

namespace trainer {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

fs::path checkpoint_dir(const Config& config) {
  return fs::path(config.output_dir) / "checkpoints";
}

// The checkpoint to resume from: none, the newest in output_dir (auto), or the named file.
std::optional<fs::path> resume_path(const Config& config) {
  if (config.resume == "none") return std::nullopt;
  if (config.resume == "auto") return newest_checkpoint(checkpoint_dir(config));
  USER_CHECK(fs::is_regular_file(config.resume), "resume = '", config.resume,
             "' is not a checkpoint file. Fix: resume = auto (newest in output_dir), none, or ",
             "the path of a checkpoint-*.pt");
  return fs::path(config.resume);
}

// Collective: every rank takes rank 0's BN statistics; rank 0 alone writes.
void save(Trainer& trainer, const Config& config, int64_t step, int64_t epoch) {
  trainer.sync_buffers();
  if (!trainer.is_rank0()) return;
  const fs::path path = checkpoint_path(checkpoint_dir(config), step);
  save_checkpoint(trainer.checkpoint(step, epoch), path);
  prune_checkpoints(checkpoint_dir(config), config.keep_checkpoints);
  spdlog::info("checkpoint {}", path.string());
}

EvalResult run_eval(Trainer& trainer, BatchSource& val, int64_t epoch, int64_t step,
                    MetricsLog& metrics) {
  trainer.sync_buffers();
  EvalResult r = trainer.evaluate(val);
  spdlog::info("eval epoch {} step {} | top-1 {:.2f}% | top-5 {:.2f}% | {} images", epoch + 1, step,
               r.top1(), r.top5(), r.images);
  metrics.write("eval", {{"epoch", epoch + 1},
                         {"step", step},
                         {"top1", r.top1()},
                         {"top5", r.top5()},
                         {"images", r.images}});
  return r;
}

// Whether to stop for a signal. Alone: as soon as one arrives. Under mpirun the ranks must stop
// at the same step (the checkpoint is collective), so they agree at each log interval.
bool should_stop(const Trainer& trainer, int64_t step, const Config& config) {
  ProcessGroup* group = trainer.group();
  if (!group || group->size() == 1) return stop_requested();
  if (step % config.log_every_steps != 0) return false;
  return group->sum(stop_requested() ? 1 : 0) > 0;
}

// Accumulates losses on the device and reads them once per log interval.
class IntervalLog {
 public:
  IntervalLog(const Config& config, at::Device device)
      : config_(config), loss_sum_(at::zeros({}, at::TensorOptions().device(device))) {}

  void add(const at::Tensor& loss) {
    loss_sum_ += loss;
    ++steps_;
  }

  void add_data_wait(double ms) { data_wait_ms_ += ms; }

  // Reads the device (the only host sync of the loop) and writes a log line and a metrics line.
  double flush(const Trainer& trainer, int64_t epoch, int64_t step, int64_t total, double lr,
               MetricsLog& metrics) {
    log_rank_spread(trainer, step, metrics);
    double loss = loss_sum_.item<double>() / std::max<int64_t>(steps_, 1);
    if (ProcessGroup* group = trainer.group(); group && group->size() > 1) {  // mean over ranks
      const auto losses = group->allgather(loss);
      loss = std::accumulate(losses.begin(), losses.end(), 0.0) / losses.size();
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    const double images_per_s = steps_ * config_.global_batch() / std::max(seconds, 1e-9);
    const double scale = trainer.loss_scaler().enabled() ? trainer.loss_scaler().scale_value() : 1;
    spdlog::info("epoch {}/{} step {}/{} | {:.1f} img/s | loss {:.4f} | lr {:.5f} | scale {:g}",
                 epoch + 1, config_.epochs, step, total, images_per_s, loss, lr, scale);
    metrics.write("train", {{"epoch", epoch + 1},
                            {"step", step},
                            {"images_per_s", images_per_s},
                            {"loss", loss},
                            {"lr", lr},
                            {"loss_scale", scale}});
    loss_sum_.zero_();
    steps_ = 0;
    data_wait_ms_ = 0;
    start_ = Clock::now();
    return loss;
  }

 private:
  // Under mpirun: each rank's compute time (forward + backward of its last step) and input wait
  // per step, gathered on every rank; the slowest rank is named (stragglers cost scaling).
  void log_rank_spread(const Trainer& trainer, int64_t step, MetricsLog& metrics) {
    ProcessGroup* group = trainer.group();
    if (!group || group->size() == 1) return;
    const double wait = data_wait_ms_ / std::max<int64_t>(steps_, 1);
    std::vector<double> compute = group->allgather(trainer.last_step_compute_ms());
    std::vector<double> waits = group->allgather(wait);
    int slowest = 0;
    for (int r = 1; r < group->size(); ++r)
      if (compute[r] + waits[r] > compute[slowest] + waits[slowest]) slowest = r;
    const auto [lo, hi] = std::minmax_element(compute.begin(), compute.end());
    spdlog::info(
        "step {} ranks: compute {:.1f}-{:.1f} ms, input wait up to {:.1f} ms; slowest "
        "rank {} ({}): {:.1f} ms compute + {:.1f} ms input wait",
        step, *lo, *hi, *std::max_element(waits.begin(), waits.end()), slowest,
        group->hosts()[slowest], compute[slowest], waits[slowest]);
    metrics.write("ranks", {{"step", step},
                            {"compute_ms_min", *lo},
                            {"compute_ms_max", *hi},
                            {"slowest_rank", int64_t{slowest}},
                            {"slowest_host", group->hosts()[slowest]}});
  }

  double data_wait_ms_ = 0;
  const Config& config_;
  at::Tensor loss_sum_;  // 0-dim float on the device
  int64_t steps_ = 0;
  Clock::time_point start_ = Clock::now();
};

}  // namespace

FitResult fit(Trainer& trainer, const Config& config, BatchSource& train, BatchSource* val,
              MetricsLog& metrics) {
  FitResult result;
  if (auto path = resume_path(config)) {
    Checkpoint checkpoint = load_checkpoint(*path);
    trainer.restore(checkpoint);
    result.steps = checkpoint.step;
    spdlog::info("resumed from {} at step {}", path->string(), checkpoint.step);
  }
  const int64_t steps_per_epoch = train.batches_per_epoch();
  const LrSchedule schedule(config, steps_per_epoch);
  int64_t total = schedule.total_steps();
  if (config.max_steps > 0) total = std::min(total, config.max_steps);
  spdlog::info("{} steps per epoch, {} steps in all, peak lr {:.5f} (global batch {})",
               steps_per_epoch, total, schedule.peak(), config.global_batch());

  IntervalLog interval(config, trainer.device());
  int64_t& step = result.steps;
  while (step < total) {
    const int64_t epoch = step / steps_per_epoch;
    train.start_epoch(epoch, step % steps_per_epoch);
    bool epoch_done = false;
    while (step < total && !epoch_done) {
      const double lr = schedule.at(step);
      const auto wait_start = Clock::now();
      Batch batch = train.next_batch();
      interval.add_data_wait(
          std::chrono::duration<double, std::milli>(Clock::now() - wait_start).count());
      interval.add(trainer.train_step(batch, lr));
      ++step;
      epoch_done = step % steps_per_epoch == 0;
      if (step % config.log_every_steps == 0 || step == total)
        result.final_loss = interval.flush(trainer, epoch, step, total, lr, metrics);
      if (should_stop(trainer, step, config)) {
        spdlog::warn("signal {} received: checkpointing at step {} and stopping",
                     stop_signal_number(), step);
        save(trainer, config, step, step / steps_per_epoch);
        result.stopped = true;
        return result;
      }
      const bool eval_now = val && config.eval_every_epochs > 0 && epoch_done &&
                            (epoch + 1) % config.eval_every_epochs == 0;
      if (eval_now || (val && step == total))
        result.final_eval = run_eval(trainer, *val, epoch, step, metrics);
      if (epoch_done || step == total ||
          (config.checkpoint_every_steps > 0 && step % config.checkpoint_every_steps == 0))
        save(trainer, config, step, step / steps_per_epoch);
    }
  }
  if (val && result.final_eval.images == 0)  // resumed at the end: still report accuracy
    result.final_eval = run_eval(trainer, *val, (total - 1) / steps_per_epoch, total, metrics);
  return result;
}

}  // namespace trainer
