#include "src/fit.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <numeric>

#include "data/step_shares.h"
#include "src/check.h"
#include "src/lr_schedule.h"
#include "src/process_stats.h"
#include "src/stop_signal.h"

namespace trainer {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

fs::path checkpoint_dir(const Config& config) {
  return fs::path(config.output_dir) / "checkpoints";
}

// The checkpoint to resume from: none, the newest in output_dir (auto), or the named file. After
// an elastic restart the run's own newest checkpoint comes first, whatever `resume` says.
std::optional<fs::path> resume_path(const Config& config) {
  if (config.resume == "auto" || config.restart_count > 0)
    if (auto newest = newest_checkpoint(checkpoint_dir(config))) return newest;
  if (config.resume == "none" || config.resume == "auto") return std::nullopt;
  USER_CHECK(fs::is_regular_file(config.resume), "resume = '", config.resume,
             "' is not a checkpoint file. Fix: resume = auto (newest in output_dir), none, or ",
             "the path of a checkpoint-*.pt");
  return fs::path(config.resume);
}

// Collective: every rank takes rank 0's BN statistics; rank 0 alone writes.
void save(Trainer& trainer, const Config& config, const Progress& at, int64_t samples_per_epoch) {
  trainer.sync_buffers();
  if (!trainer.is_rank0()) return;
  const fs::path path = checkpoint_path(checkpoint_dir(config), at.step);
  Checkpoint checkpoint = trainer.checkpoint(at);
  checkpoint.samples_per_epoch = samples_per_epoch;
  save_checkpoint(checkpoint, path);
  prune_checkpoints(checkpoint_dir(config), config.keep_checkpoints);
  spdlog::info("checkpoint {}", path.string());
}

// Restores the newest state (resume) and says where the run continues, and what changed since
// the checkpoint's run: world size, global batch, peak LR (Note [Elastic epoch order]).
Progress resume(Trainer& trainer, const Config& config, int64_t samples_per_epoch,
                const LrSchedule& schedule) {
  const std::optional<fs::path> path = resume_path(config);
  if (!path) return {};
  const Checkpoint checkpoint = load_checkpoint(*path);
  trainer.restore(checkpoint);
  Progress at = checkpoint.progress;
  spdlog::info("resumed from {}: epoch {}, image {} of {}, step {}{}", path->string(), at.epoch + 1,
               at.samples_in_epoch, samples_per_epoch, at.step,
               config.restart_count > 0
                   ? " (restart " + std::to_string(config.restart_count) + " by the elastic agent)"
                   : "");
  if (checkpoint.world_size != config.world_size ||
      checkpoint.global_batch != config.global_batch())
    spdlog::info(
        "resized: world size {} -> {}, global batch {} -> {}, peak lr {:.5f} -> {:.5f}",
        checkpoint.world_size, config.world_size, checkpoint.global_batch, config.global_batch(),
        config.base_lr * static_cast<double>(checkpoint.global_batch) / 256.0, schedule.peak());
  if (checkpoint.samples_per_epoch != samples_per_epoch) {
    spdlog::warn(
        "the training data holds {} images, the checkpoint's run had {}: the rest of epoch {} is "
        "drawn from a different order, so some images may be trained twice or not at all",
        samples_per_epoch, checkpoint.samples_per_epoch, at.epoch + 1);
    if (at.samples_in_epoch >= samples_per_epoch) at = {at.step, at.epoch + 1, 0};
  }
  return at;
}

// After the run's first step (collective): how long it took from launch, on the slowest rank, and
// what the ranks read to get there. `loss`: the step's, read so that the time includes the device.
void log_startup(const Trainer& trainer, const at::Tensor& loss, int64_t step,
                 MetricsLog& metrics) {
  loss.item();
  double seconds = seconds_since_process_start();
  int64_t bytes = bytes_read_by_process();
  if (ProcessGroup* group = trainer.group()) {
    const auto all = group->allgather(seconds);
    seconds = *std::max_element(all.begin(), all.end());
    bytes = group->sum(bytes);
  }
  spdlog::info(
      "start-up: first step done {:.1f} s after launch; {:.1f} MB read by the ranks so far",
      seconds, static_cast<double>(bytes) / 1e6);
  metrics.write("startup",
                {{"step", step}, {"seconds_to_first_step", seconds}, {"bytes_read", bytes}});
}

// Optimisation steps from `at` to the end of training (max_steps aside).
int64_t steps_to_end(const Config& config, const Progress& at, int64_t samples_per_epoch) {
  if (at.epoch >= config.epochs) return 0;
  const int64_t global = config.global_batch();
  return steps_left(samples_per_epoch, at.samples_in_epoch, global) +
         (config.epochs - at.epoch - 1) * steps_left(samples_per_epoch, 0, global);
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

  // `loss`: this rank's mean over its `rows` images; `step_images`: the step's over all ranks.
  void add(const at::Tensor& loss, int64_t rows, int64_t step_images) {
    loss_sum_.add_(loss, rows);
    rows_ += rows;
    images_ += step_images;
    ++steps_;
  }

  void add_data_wait(double ms) { data_wait_ms_ += ms; }

  // Reads the device (the only host sync of the loop) and writes a log line and a metrics line.
  double flush(const Trainer& trainer, int64_t epoch, int64_t step, int64_t total, double lr,
               MetricsLog& metrics) {
    log_rank_spread(trainer, step, metrics);
    double loss_sum = loss_sum_.item<double>();
    int64_t rows = rows_;
    if (ProcessGroup* group = trainer.group(); group && group->size() > 1) {  // over all images
      const auto sums = group->allgather(loss_sum);
      loss_sum = std::accumulate(sums.begin(), sums.end(), 0.0);
      rows = group->sum(rows);
    }
    const double loss = loss_sum / static_cast<double>(std::max<int64_t>(rows, 1));
    const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    const double images_per_s = static_cast<double>(images_) / std::max(seconds, 1e-9);
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
    steps_ = rows_ = images_ = 0;
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
  at::Tensor loss_sum_;  // 0-dim float on the device: sum of this rank's per-image losses
  int64_t steps_ = 0;
  int64_t rows_ = 0;    // this rank's images in the interval
  int64_t images_ = 0;  // all ranks' images in the interval
  Clock::time_point start_ = Clock::now();
};

}  // namespace

FitResult fit(Trainer& trainer, const Config& config, BatchSource& train, BatchSource* val,
              MetricsLog& metrics, SampleTrace* trace) {
  FitResult result;
  const int64_t samples = train.samples_per_epoch(), global = config.global_batch();
  const LrSchedule schedule(config, samples);
  if (trainer.is_rank0())
    if (int n = remove_unfinished_checkpoints(checkpoint_dir(config)))
      spdlog::warn("removed {} unfinished checkpoint file(s) left in {} by a killed writer", n,
                   checkpoint_dir(config).string());
  Progress at = resume(trainer, config, samples, schedule);
  int64_t total = at.step + steps_to_end(config, at, samples);
  if (config.max_steps > 0) total = std::min(total, config.max_steps);
  spdlog::info(
      "{} images and {} steps per epoch, {} steps in all, peak lr {:.5f} (global batch {})",
      samples, steps_left(samples, 0, global), total, schedule.peak(), global);

  IntervalLog interval(config, trainer.device());
  int64_t steps_this_run = 0;
  while (at.epoch < config.epochs && at.step < total) {
    const int64_t epoch = at.epoch;
    train.start_epoch(epoch, at.samples_in_epoch);
    bool epoch_done = false;
    while (!epoch_done && at.step < total) {
      const int64_t step_images = step_samples(samples, at.samples_in_epoch, global);
      const double lr = schedule.at(epoch * samples + at.samples_in_epoch, step_images);
      const auto wait_start = Clock::now();
      Batch batch = train.next_batch();
      interval.add_data_wait(
          std::chrono::duration<double, std::milli>(Clock::now() - wait_start).count());
      const int64_t rows = batch.labels.size(0);
      // This rank's share of the step's images, relative to an even share (1 in a full step).
      const double weight = static_cast<double>(rows * config.world_size) / step_images;
      const at::Tensor loss = trainer.train_step(batch, lr, weight);
      interval.add(loss, rows, step_images);
      if (trace) trace->write(epoch, at.step, batch.ids);
      if (++steps_this_run == 1) log_startup(trainer, loss, at.step + 1, metrics);
      ++at.step;
      at.samples_in_epoch += step_images;
      epoch_done = at.samples_in_epoch == samples;
      if (epoch_done) at = {at.step, epoch + 1, 0};
      const int64_t step = at.step;
      if (step % config.log_every_steps == 0 || step == total)
        result.final_loss = interval.flush(trainer, epoch, step, total, lr, metrics);
      if (should_stop(trainer, step, config)) {
        spdlog::warn("signal {} received: checkpointing at step {} and stopping",
                     stop_signal_number(), step);
        save(trainer, config, at, samples);
        result.steps = step;
        result.stopped = true;
        return result;
      }
      const bool eval_now = val && config.eval_every_epochs > 0 && epoch_done &&
                            (epoch + 1) % config.eval_every_epochs == 0;
      if (eval_now || (val && step == total))
        result.final_eval = run_eval(trainer, *val, epoch, step, metrics);
      if (epoch_done || step == total ||
          (config.checkpoint_every_steps > 0 && step % config.checkpoint_every_steps == 0))
        save(trainer, config, at, samples);
    }
  }
  result.steps = at.step;
  if (val && result.final_eval.images == 0)  // resumed at the end: still report accuracy
    result.final_eval =
        run_eval(trainer, *val, std::max<int64_t>(at.epoch - 1, 0), at.step, metrics);
  return result;
}

}  // namespace trainer
