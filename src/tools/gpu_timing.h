// Timing of GPU work for the benchmark tools: CUDA events on the current stream, no host sync
// inside the timed runs.
#pragma once

#include <ATen/cuda/CUDAEvent.h>

#include <cstdint>
#include <functional>

namespace trainer {

// Mean milliseconds of `work` on the current stream, after warm-up runs (cuDNN's autotuning).
inline double time_ms(int64_t iterations, const std::function<void()>& work) {
  for (int i = 0; i < 3; ++i) work();
  at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
  start.record();
  for (int64_t i = 0; i < iterations; ++i) work();
  stop.record();
  stop.synchronize();
  return start.elapsed_time(stop) / static_cast<double>(iterations);
}

}  // namespace trainer
