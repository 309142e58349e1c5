#include "src/run/fit.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <optional>
#include <utility>

#include "base/bounded_wait.h"
#include "base/stop_signal.h"
#include "base/user_error.h"
#include "data/sources/step_shares.h"
#include "src/report/interval_log.h"
#include "src/report/process_stats.h"
#include "src/run/data_order_check.h"
#include "src/run/evaluation.h"
#include "src/run/start.h"
#include "src/train/lr_schedule.h"
#include "src/train/step_profile.h"
#include "src/train/weight_average.h"

namespace trainer {
namespace {

using Clock = std::chrono::steady_clock;

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

// Optimisation steps in an epoch of `samples` images started from its beginning.
int64_t steps_per_epoch(const FitOptions& options, int64_t samples) {
  return steps_left(epoch_end(samples, 0, options.whole_steps_of), 0, options.images_per_step);
}

// Optimisation steps from `at` to the end of training (max_steps aside).
int64_t steps_to_end(const FitOptions& options, const Progress& at, int64_t samples_per_epoch) {
  if (at.epoch >= options.epochs) return 0;
  const int64_t end = epoch_end(samples_per_epoch, at.samples_in_epoch, options.whole_steps_of);
  return steps_left(end, at.samples_in_epoch, options.images_per_step) +
         (options.epochs - at.epoch - 1) * steps_per_epoch(options, samples_per_epoch);
}

// Note [A stop at any step]
// A stop signal must be answered with a checkpoint before the launcher's SIGKILL (mpirun's
// daemons send it odls_base_sigkill_timeout = 20 s after SIGTERM; a pod's grace period likewise),
// whatever log_every_steps is. Alone, the run stops at the end of the step the signal came in.
// With other ranks the checkpoint is collective, so they must agree on the step: each step ends
// by reading a sum of the ranks' stop flags started at the end of the step before, and starting
// the next one. The sum runs on a channel of its own during the step (a non-blocking all-reduce
// of one host integer), so reading it a step later costs nothing and never waits for the device;
// every rank reads the same sums in the same order, so all stop at the same step: the one after
// the signal's, or the one after that. A run that ends reads the last sum it started.

// Note [Fixed global batch]
// By default a step is one batch of every rank, so a resize changes the global batch and the
// learning rate with it (linear scaling rule). With `global_batch = N` a step is N images however
// many ranks there are. batch_size is then the largest micro-batch a GPU takes: where N leaves
// fewer images per rank (N < batch_size x ranks, many nodes), the micro-batch shrinks to
// N / ranks (Config::micro_batch_size), so a recipe starts at any node count. Otherwise each
// rank accumulates gradients over N / (batch_size x ranks) micro-batches. Either way the step is
// the nearest whole number of micro-batches below N, logged when N is not reached exactly, and
// the gradients are averaged over ranks once, after the last micro-batch's backward
// (GradientReducer::set_accumulating), so the optimisation is that of one batch of N. The source
// deals the epoch out in micro-batches of micro-batch x ranks images (Note [Elastic epoch
// order]); a step takes as many as make its images, so the epoch's last step has fewer, and
// every image is still trained once per epoch across resizes. Each micro-batch's loss is weighted
// by its images over the step's, as a rank's share of a short step is.

// Runs the epochs from a resume point to the end (or max_steps, or a stop signal).
class TrainingLoop {
 public:
  TrainingLoop(Trainer& trainer, const FitOptions& options, BatchSource& train, BatchSource* val,
               MetricsLog& metrics, SampleTrace* trace)
      : trainer_(trainer),
        options_(options),
        train_(train),
        val_(val),
        metrics_(metrics),
        trace_(trace),
        samples_(train.samples_per_epoch()),
        schedule_(options.schedule, samples_),
        interval_(options.interval, trainer.device()) {}

  FitResult run() {
    const StartOptions& start = options_.start;
    if (trainer_.is_rank0())
      if (int n = remove_unfinished_checkpoints(start.checkpoint_dir))
        spdlog::warn("removed {} unfinished checkpoint file(s) left in {} by a killed writer", n,
                     start.checkpoint_dir.string());
    at_ = resume(trainer_, start, samples_, schedule_);
    total_ = at_.step + steps_to_end(options_, at_, samples_);
    if (options_.max_steps > 0) total_ = std::min(total_, options_.max_steps);
    start_order_check();
    const int64_t global = options_.images_per_step;
    spdlog::info(
        "{} images and {} steps per epoch{}, {} steps in all, peak lr {:.5f} (global batch {})",
        samples_, steps_per_epoch(options_, samples_),
        options_.whole_steps_of > 0 && samples_ % global != 0
            ? " (drop_last: the last " + std::to_string(samples_ % global) + " not trained)"
            : "",
        total_, schedule_.peak(), global);
    if (TensorBoardWriter* tensorboard = metrics_.tensorboard()) {
      // Events a killed run wrote after the checkpoint (steps > at_.step) are trained again: drop
      // them. From scratch, drop everything an earlier run in this folder wrote.
      tensorboard->session_start(at_.step == 0 ? 0 : at_.step + 1);
      tensorboard->text("config", at_.step, "    " + indent(trainer_.resolved_config()));
    }
    try {
      if (at_.eval_pending && val_) evaluate(at_.epoch - 1);  // stopped before it ran
      if (at_.target_reached)
        spdlog::info("target_top1 {}% was reached at step {}: nothing left to train",
                     options_.target_top1, at_.step);
      while (at_.epoch < options_.epochs && at_.step < total_ && !at_.target_reached) {
        announce_image_size(at_.epoch);
        train_.start_epoch(at_.epoch, at_.samples_in_epoch);
        end_ = epoch_end(samples_, at_.samples_in_epoch, options_.whole_steps_of);
        if (at_.samples_in_epoch == end_) {  // resumed past the epoch's last whole step
          end_epoch_without_a_step();
          continue;
        }
        const int64_t epoch = at_.epoch;
        while (at_.epoch == epoch && at_.step < total_ && !at_.target_reached)
          if (!step()) return result_;
      }
    } catch (const StopRequested& stop) {
      return stopped_while_waiting(stop);
    }
    if (stop_vote_) stop_vote_();  // the sum the last step started (Note [A stop at any step])
    result_.steps = at_.step;
    if (val_ && result_.final_eval.images == 0)  // resumed at the end: still report accuracy
      evaluate(std::max<int64_t>(at_.epoch - 1, 0));
    return result_;
  }

 private:
  // Whether the EMA update of the step after `trained` images copies the weights.
  bool ema_copies(int64_t trained) const {
    return options_.ema_warmup_reset &&
           warmup_update_copies(schedule_, trained,
                                options_.ema_every_steps * options_.images_per_step);
  }

  // drop_last, resumed at another batch with less than one of its steps left in the epoch (Note
  // [The last partial step]): the epoch ends where it resumed, and evaluates if it is its turn.
  void end_epoch_without_a_step() {
    const int64_t epoch = at_.epoch;
    at_ = {at_.step, epoch + 1, 0};
    if (val_ && options_.eval_every_epochs > 0 && (epoch + 1) % options_.eval_every_epochs == 0)
      evaluate(epoch);
  }

  // Note [Data order that skews training]: judged over the run's first steps, if it reaches them.
  void start_order_check() {
    if (!options_.check_data_order) return;
    const int64_t window =
        data_order_window(options_.num_classes, options_.world_size, options_.images_per_step,
                          steps_per_epoch(options_, samples_));
    if (window > 0 && at_.step + window <= total_)
      order_check_.emplace(options_.num_classes, window, options_.by_node);
  }

  // Micro-batches in a step of `step_images` from where the epoch is, as the source deals them:
  // full ones, then the rest, which takes a last single image along (step_samples).
  int64_t micro_batches_in(int64_t step_images) const {
    int64_t count = 0;
    for (int64_t taken = 0; taken < step_images; ++count)
      taken += step_samples(end_, at_.samples_in_epoch + taken, options_.images_per_micro_batch);
    return count;
  }

  // This rank's next micro-batch of the step, as the source deals them out (Note [Fixed global
  // batch]), its wait timed; `rows` counts its images.
  Batch next_micro_batch(int64_t& rows) {
    const auto wait_start = Clock::now();
    Batch batch = [&] {
      const StepPhase phase("input wait");
      return train_.next_batch();
    }();
    interval_.add_data_wait(
        std::chrono::duration<double, std::milli>(Clock::now() - wait_start).count());
    if (at_.samples_in_epoch == 0 && rows == 0)
      write_preview(trainer_, batch, "input/train", at_.step, metrics_);
    rows += batch.labels.size(0);
    if (order_check_) order_check_->add(batch);
    if (trace_) trace_->write(at_.epoch, at_.step, batch.ids);
    return batch;
  }

  // One optimisation step and what follows it: logs, evaluation, checkpoint. False when a stop
  // signal ended training (after a checkpoint).
  bool step() {
    const int64_t epoch = at_.epoch, global = options_.images_per_step;
    const int64_t step_images = step_samples(end_, at_.samples_in_epoch, global);
    const double lr = schedule_.at(epoch * samples_ + at_.samples_in_epoch, step_images);
    StepInputs inputs;
    inputs.lr = lr;
    inputs.micro_batches = micro_batches_in(step_images);
    inputs.step_images = step_images;
    inputs.ema_copies = ema_copies(epoch * samples_ + at_.samples_in_epoch);
    int64_t rows = 0;
    const at::Tensor loss = trainer_.step(inputs, [&] { return next_micro_batch(rows); });
    interval_.add(loss, rows, step_images);
    if (++steps_this_run_ == 1) log_startup(trainer_, loss, at_.step + 1, metrics_);
    if (order_check_ && order_check_->end_step()) {
      order_check_->judge(trainer_.group());
      order_check_.reset();
    }
    ++at_.step;
    at_.samples_in_epoch += step_images;
    const bool epoch_done = at_.samples_in_epoch == end_;
    const double epoch_fraction =
        epoch_done ? 1.0 : static_cast<double>(at_.samples_in_epoch) / samples_;
    if (epoch_done) at_ = {at_.step, epoch + 1, 0};
    const int64_t step = at_.step;
    if (step % options_.log_every_steps == 0 || step == total_)
      result_.final_loss = interval_.flush(
          trainer_, train_, {epoch, epoch_fraction, step, total_, lr, image_size_}, metrics_);
    const bool eval_now = val_ && options_.eval_every_epochs > 0 && epoch_done &&
                          (epoch + 1) % options_.eval_every_epochs == 0;
    at_.eval_pending = eval_now;  // until evaluate() has run: a checkpoint before carries it over
    if (stop_agreed(step)) {
      spdlog::warn("signal {} received: checkpointing at step {} and stopping{}",
                   stop_signal_number(), step,
                   eval_now ? " (the epoch's evaluation runs when the run resumes)" : "");
      save(trainer_, options_.start, at_, samples_);
      metrics_.flush();
      result_.steps = step;
      result_.stopped = true;
      return false;
    }
    if (eval_now || (val_ && step == total_)) evaluate(epoch);
    if (epoch_done || step == total_ ||
        (options_.checkpoint_every_steps > 0 && step % options_.checkpoint_every_steps == 0))
      save(trainer_, options_.start, at_, samples_);
    return true;
  }

  // Whether every rank stops after `step` for a signal (Note [A stop at any step]).
  bool stop_agreed(int64_t step) {
    ProcessGroup* group = trainer_.group();
    if (!group || group->size() == 1) return stop_requested();
    const bool agreed = stop_vote_ && stop_vote_() > 0;
    stop_vote_ = nullptr;
    if (!agreed)
      stop_vote_ = group->start_sum(stop_requested() ? 1 : 0,
                                    "the stop vote started after step " + std::to_string(step));
    return agreed;
  }

  // A stop signal came while this rank waited for data (its next batch, or an evaluation's),
  // and the data did not come within kStopGrace. The state is that of the last step taken. Alone,
  // checkpoint it. With other ranks no checkpoint can be agreed on (they may be inside the next
  // step's collectives, which this rank will not join): end the job, saying where it resumes.
  FitResult stopped_while_waiting(const StopRequested& stop) {
    ProcessGroup* group = trainer_.group();
    if (!group || group->size() == 1) {
      spdlog::warn("{}: checkpointing at step {} and stopping", stop.what(), at_.step);
      save(trainer_, options_.start, at_, samples_);
      metrics_.flush();
      result_.steps = at_.step;
      result_.stopped = true;
      return result_;
    }
    const auto newest = newest_checkpoint(options_.start.checkpoint_dir);
    throw StopRequested(detail::concat(
        stop.what(), "; no checkpoint written at step ", at_.step,
        ": the other ranks cannot join one while this rank has no batch. The run resumes from ",
        newest ? newest->string() : std::string("its start (no checkpoint yet)")));
  }

  // The training crop of `epoch`, which the source yields from start_epoch on (Note [Image size
  // per epoch]); logged under progressive resizing at the start and when it changes. cuDNN
  // (cudnn_benchmark, set once for the process in main_train.cpp) keys its algorithm cache by the
  // convolutions' shapes, so it times its algorithms again by itself once for each new size, on
  // that size's first steps, and reuses them from then on.
  void announce_image_size(int64_t epoch) {
    const std::optional<ImageSizeSchedule>& sizes = options_.image_sizes;
    const int64_t size = sizes ? sizes->at(epoch) : options_.image_size;
    if (sizes && image_size_ == 0)
      spdlog::info("epoch {}: training crop {} px (progressive resizing {} -> {} px, epochs {}-{})",
                   epoch + 1, size, sizes->min_size, sizes->max_size, sizes->start_epoch + 1,
                   sizes->end_epoch + 1);
    else if (sizes && size != image_size_)
      spdlog::info("epoch {}: training crop {} -> {} px", epoch + 1, image_size_, size);
    image_size_ = size;
  }

  void evaluate(int64_t epoch) {
    if (!eval_previewed_ && trainer_.is_rank0())
      write_eval_preview(trainer_, *val_, at_.step, metrics_);
    eval_previewed_ = true;
    result_.final_eval = run_eval(trainer_, *val_, epoch, at_.step, metrics_);
    at_.eval_pending = false;
    if (options_.target_top1 > 0 && !at_.target_reached &&
        result_.final_eval.top1() >= options_.target_top1)
      reached_target(epoch);
    metrics_.flush();
  }

  // MLPerf's rule: training ends at the first evaluation that reaches the target. The step's
  // checkpoint follows (an evaluation comes at an epoch's end), and records it for a relaunch.
  void reached_target(int64_t epoch) {
    at_.target_reached = result_.target_reached = true;
    const double seconds = seconds_since_process_start();
    spdlog::info(
        "target_top1 {}% reached: top-1 {:.2f}% at epoch {}, step {}; time to accuracy {:.1f} s "
        "from this run's launch{}",
        options_.target_top1, result_.final_eval.top1(), epoch + 1, at_.step, seconds,
        steps_this_run_ < at_.step ? " (it resumed from a checkpoint: add the earlier runs')" : "");
    metrics_.write("target", {{"epoch", epoch + 1},
                              {"step", at_.step},
                              {"top1", result_.final_eval.top1()},
                              {"target_top1", options_.target_top1},
                              {"seconds", seconds}});
  }

  // Markdown shows text indented by four spaces as it is.
  static std::string indent(const std::string& text) {
    std::string out;
    for (char c : text) out += c == '\n' ? std::string("\n    ") : std::string(1, c);
    return out;
  }

  Trainer& trainer_;
  const FitOptions& options_;
  BatchSource& train_;
  BatchSource* val_;
  MetricsLog& metrics_;
  SampleTrace* trace_;
  const int64_t samples_;  // images in a training epoch
  int64_t end_ = 0;        // where the current epoch ends (Note [The last partial step])
  const LrSchedule schedule_;
  IntervalLog interval_;
  Progress at_;
  int64_t total_ = 0;  // steps in the whole run
  int64_t steps_this_run_ = 0;
  int64_t image_size_ = 0;  // the training crop of the epoch under way, pixels; 0 before the first
  bool eval_previewed_ = false;
  std::function<int64_t()> stop_vote_;  // the ranks' stop flags summed since the last step
  FitResult result_;
  std::optional<DataOrderCheck> order_check_;  // until judged
};

}  // namespace

FitResult fit(Trainer& trainer, const FitOptions& options, BatchSource& train, BatchSource* val,
              MetricsLog& metrics, SampleTrace* trace) {
  return TrainingLoop(trainer, options, train, val, metrics, trace).run();
}

}  // namespace trainer
