// What the training loop reports every log interval, to the log, metrics.jsonl and TensorBoard:
// the loss over every rank's images, images/s, the learning rate and loss scale, the input wait
// per step and, over several ranks, each rank's input wait, compute, all-reduce and link with
// the rank that holds the step back named, and what holds it;
// steps skipped for overflow and bad records so far; the epoch's progress and the time left for
// the run at the current speed. Losses accumulate on the device and are read once per interval.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "data/sources/batch_source.h"
#include "src/report/metrics_log.h"
#include "src/train/trainer.h"

namespace trainer {

struct IntervalLogOptions {
  int64_t epochs = 90;  // of the whole run, for "epoch 3/90" and the time left
};

class IntervalLog {
 public:
  IntervalLog(const IntervalLogOptions& options, at::Device device);

  // `loss`: this rank's mean over its `rows` images; `step_images`: the step's over all ranks.
  void add(const at::Tensor& loss, int64_t rows, int64_t step_images);
  void add_data_wait(double ms);  // time spent waiting for the input this step

  // Where the run stands after the interval's last step.
  struct Position {
    int64_t epoch = 0;          // that step's epoch, 0-based
    double epoch_fraction = 0;  // of that epoch trained, in [0, 1]
    int64_t step = 0;           // steps done
    int64_t total_steps = 0;    // steps in the whole run
    double lr = 0;              // that step's learning rate
    int64_t image_size = 0;     // that step's training crop, pixels (progressive resizing)
  };
  // Collective: reads the device (the loop's only host sync), gathers over the ranks and writes
  // the log line and metrics. Returns the interval's mean loss.
  double flush(Trainer& trainer, const BatchSource& train, const Position& at, MetricsLog& metrics);

 private:
  // Per step, over the ranks: the longest input wait, and max - min of compute time. Also
  // logs and writes each rank's figures and the rank that holds the step back.
  struct RankSpread {
    double input_wait_ms = 0;
    double compute_spread_ms = 0;
  };
  RankSpread rank_spread(Trainer& trainer, int64_t step, MetricsLog& metrics) const;
  void reset();

  const IntervalLogOptions options_;
  at::Tensor loss_sum_;  // 0-dim float on the device: sum of this rank's per-image losses
  int64_t steps_ = 0;
  int64_t rows_ = 0;    // this rank's images in the interval
  int64_t images_ = 0;  // all ranks' images in the interval
  double data_wait_ms_ = 0;
  std::chrono::steady_clock::time_point start_;
};

// "1h02m", "3m12s", "45s": a duration for the log line.
std::string format_duration(double seconds);

}  // namespace trainer
