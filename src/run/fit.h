// The training loop: resume, epochs of steps at the scheduled learning rate, logs every N steps,
// evaluation each epoch (src/run/evaluation.h), checkpoints every N steps and at each epoch end,
// and a final evaluation.
#pragma once

#include <optional>
#include <string>

#include "data/sources/batch_source.h"
#include "data/sources/image_size_schedule.h"
#include "src/report/interval_log.h"
#include "src/report/metrics_log.h"
#include "src/report/sample_trace.h"
#include "src/run/start.h"
#include "src/train/lr_schedule.h"
#include "src/train/trainer.h"

namespace trainer {

// What the loop reads of the configuration (made at the seam, src/part_options.cpp).
struct FitOptions {
  int64_t epochs = 1;
  int64_t max_steps = 0;  // 0: all epochs
  // A step's images across the ranks, and a micro-batch's (Note [Fixed global batch]).
  int64_t images_per_step = 0;
  int64_t images_per_micro_batch = 0;
  // With drop_last, an epoch ends at its last whole step of this many images; 0 without
  // (Note [The last partial step]). epoch_end's `whole_steps_of`, from Config::whole_steps_of.
  int64_t whole_steps_of = 0;
  int64_t log_every_steps = 50;
  int64_t eval_every_epochs = 1;       // 0: only at the end
  int64_t checkpoint_every_steps = 0;  // 0: at each epoch's end only
  double target_top1 = 0;              // 0: train every epoch
  bool ema_warmup_reset = false;       // the LR warmup's EMA updates copy the weights
  int64_t ema_every_steps = 1;
  // The data order check over the run's first steps (Note [Data order that skews training]).
  bool check_data_order = true;
  int64_t num_classes = 0;
  int world_size = 1;
  bool by_node = false;  // epoch_order = by_node
  // The training crop: image_size, or each epoch's under progressive resizing.
  int64_t image_size = 0;
  std::optional<ImageSizeSchedule> image_sizes;
  LrScheduleOptions schedule;
  IntervalLogOptions interval;
  StartOptions start;
};

struct FitResult {
  int64_t steps = 0;            // optimisation steps completed, resumed ones included
  bool stopped = false;         // a stop signal ended training early (a checkpoint was written)
  bool target_reached = false;  // an evaluation reached target_top1, which ended training
  EvalResult final_eval;        // the last evaluation (images == 0 without a validation source)
  double final_loss = 0.0;      // mean loss of the last log interval
};

// Trains `trainer` per `options` on `train`, evaluating on `val` when given (may be null), from
// the newest checkpoint when resuming. `trace`, when given, records each step's sample ids.
FitResult fit(Trainer& trainer, const FitOptions& options, BatchSource& train, BatchSource* val,
              MetricsLog& metrics, SampleTrace* trace = nullptr);

}  // namespace trainer
