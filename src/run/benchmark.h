// Benchmark mode: training steps on synthetic data, timed after warm-up, reported as images/s and
// step-time median / p90 — the figures users compare with tf_cnn_benchmarks and NVIDIA's examples.
// On the GPU each step is bracketed by CUDA events read once at the end: no per-step host sync.
#pragma once

#include "data/sources/batch_source.h"
#include "src/train/lr_schedule.h"
#include "src/train/trainer.h"

namespace trainer {

struct BenchmarkResult {
  int64_t steps = 0;
  int64_t batch_size = 0;   // per GPU
  double images_per_s = 0;  // per GPU, over the timed steps
  double step_ms_median = 0;
  double step_ms_p90 = 0;
  StepTimes times;  // where the timed steps went, means (the gradient all-reduce past backward)
};

struct BenchmarkOptions {
  int64_t warmup_steps = 20;   // untimed (cuDNN autotuning among them)
  int64_t steps = 100;         // timed
  int64_t batch_size = 256;    // per GPU
  LrScheduleOptions schedule;  // the steps run at its peak learning rate
};

BenchmarkResult run_benchmark(Trainer& trainer, BatchSource& source,
                              const BenchmarkOptions& options);

}  // namespace trainer
