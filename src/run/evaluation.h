// Evaluation on the validation source: each epoch's during training (fit), a run that only
// evaluates (evaluate_only), and the input previews TensorBoard shows of both.
#pragma once

#include <string>

#include "data/sources/batch_source.h"
#include "src/report/metrics_log.h"
#include "src/run/start.h"
#include "src/train/trainer.h"

namespace trainer {

// Evaluates the weights (and the EMA beside them) on `val` after `epoch` (0-based) at `step`;
// logs and records the result. Collective: every rank calls it.
EvalResult run_eval(Trainer& trainer, BatchSource& val, int64_t epoch, int64_t step,
                    MetricsLog& metrics);

// Rank 0, where TensorBoard is on: the first images of `batch` as the model sees them, as `tag`.
void write_preview(Trainer& trainer, const Batch& batch, const std::string& tag, int64_t step,
                   MetricsLog& metrics);

// The evaluation crops, once per run (rank 0, TensorBoard on): the first batch of `val`.
void write_eval_preview(Trainer& trainer, BatchSource& val, int64_t step, MetricsLog& metrics);

// Evaluates `val` once with the weights of init_weights, else of the checkpoint `resume` names
// (FILE, or with auto the newest in output_dir), and records the result. Every rank loads them.
EvalResult evaluate_only(Trainer& trainer, const StartOptions& options, BatchSource& val,
                         MetricsLog& metrics);

}  // namespace trainer
