#include "src/run/benchmark.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <vector>

#include "src/train/lr_schedule.h"

namespace trainer {
namespace {

// Step times in milliseconds, from events recorded on the current CUDA stream between steps.
std::vector<double> time_steps_cuda(const std::function<void()>& step, int64_t steps,
                                    c10::Device device) {
  c10::cuda::CUDAGuard guard(device);
  std::vector<at::cuda::CUDAEvent> events;
  events.reserve(steps + 1);
  for (int64_t i = 0; i <= steps; ++i) events.emplace_back(cudaEventDefault);
  events[0].record();
  for (int64_t i = 0; i < steps; ++i) {
    step();
    events[i + 1].record();
  }
  events.back().synchronize();
  std::vector<double> ms;
  for (int64_t i = 0; i < steps; ++i) ms.push_back(events[i].elapsed_time(events[i + 1]));
  return ms;
}

std::vector<double> time_steps_cpu(const std::function<void()>& step, int64_t steps) {
  std::vector<double> ms;
  for (int64_t i = 0; i < steps; ++i) {
    auto start = std::chrono::steady_clock::now();
    step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  return ms;
}

double percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  const size_t index = std::min(values.size() - 1, static_cast<size_t>(p * values.size()));
  return values[index];
}

}  // namespace

BenchmarkResult run_benchmark(Trainer& trainer, BatchSource& source,
                              const BenchmarkOptions& options) {
  const double lr = LrSchedule(options.schedule, source.samples_per_epoch()).peak();
  source.start_epoch(0);
  at::Tensor sink;  // keeps the last loss alive so no step is optimised away
  auto step = [&] {
    if (source.batches_left() == 0) source.start_epoch(0);
    sink = trainer.train_step(source.next_batch(), lr);
  };
  for (int64_t i = 0; i < options.warmup_steps; ++i) step();  // cuDNN autotuning too
  trainer.take_step_times();                                   // the warm-up's, dropped

  std::vector<double> ms = trainer.device().is_cuda()
                               ? time_steps_cuda(step, options.steps, trainer.device())
                               : time_steps_cpu(step, options.steps);
  BenchmarkResult r;
  r.steps = options.steps;
  r.batch_size = options.batch_size;
  const double total_ms = std::accumulate(ms.begin(), ms.end(), 0.0);
  r.images_per_s = r.steps * r.batch_size / (total_ms / 1000.0);
  r.step_ms_median = percentile(ms, 0.5);
  r.step_ms_p90 = percentile(ms, 0.9);
  r.times = trainer.take_step_times();
  return r;
}

}  // namespace trainer
