// The training loop: resume, epochs of steps at the scheduled learning rate, logs every N steps,
// evaluation each epoch (src/evaluation.h), checkpoints every N steps and at each epoch end, and
// a final evaluation.
#pragma once

#include "data/sources/batch_source.h"
#include "src/config.h"
#include "src/report/metrics_log.h"
#include "src/report/sample_trace.h"
#include "src/train/trainer.h"

namespace trainer {

struct FitResult {
  int64_t steps = 0;            // optimisation steps completed, resumed ones included
  bool stopped = false;         // a stop signal ended training early (a checkpoint was written)
  bool target_reached = false;  // an evaluation reached target_top1, which ended training
  EvalResult final_eval;        // the last evaluation (images == 0 without a validation source)
  double final_loss = 0.0;      // mean loss of the last log interval
};

// Trains `trainer` per `config` on `train`, evaluating on `val` when given (may be null), from
// the newest checkpoint when resuming. `trace`, when given, records each step's sample ids.
FitResult fit(Trainer& trainer, const Config& config, BatchSource& train, BatchSource* val,
              MetricsLog& metrics, SampleTrace* trace = nullptr);

}  // namespace trainer
