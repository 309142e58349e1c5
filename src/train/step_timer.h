// Where a rank's steps go between two log intervals: its input wait, its forward and backward,
// and its gradient all-reduce past the end of backward. On the host for the CPU's steps, which
// run synchronously; on the GPU with events on the step's stream, read only when the interval
// asks (no per-step host sync), for the interval's last kTimedSteps steps.
#pragma once

#include <ATen/cuda/CUDAEvent.h>
#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <vector>

namespace trainer {

// Means per step, ms.
struct StepTimes {
  double input_ms = 0;      // waiting for its batches (the host's time in next_batch)
  double compute_ms = 0;    // forward and backward, less that wait; a step replayed from the
                            // CUDA graph counts its all-reduce and update too
  double allreduce_ms = 0;  // the gradient all-reduce's time past the end of backward (what
                            // overlap did not hide); NaN where it runs inside the graph's replay
};

class StepTimer {
 public:
  explicit StepTimer(c10::Device device);

  void begin();                    // a step starts, on the current stream
  void add_input_wait(double ms);  // the step waited this long for a batch
  void backward_done();            // its backward is enqueued
  void reduced();                  // its gradient all-reduce is enqueued (several ranks)
  void replayed();                 // its CUDA graph's replay is enqueued: the step's end
  StepTimes take();                // the means since the last take; reads the device

 private:
  struct Timed {  // one step on the GPU
    at::cuda::CUDAEvent start{cudaEventDefault}, backward_done{cudaEventDefault},
        reduced{cudaEventDefault};
    double input_ms = 0;
    bool complete = false;  // every event of this step recorded (none while a graph records)
    bool has_reduce = false, replayed = false;
  };
  static constexpr size_t kTimedSteps = 16;
  Timed& current() { return ring_[(steps_ - 1) % ring_.size()]; }

  using Clock = std::chrono::steady_clock;
  std::vector<Timed> ring_;  // on the GPU only
  int64_t steps_ = 0;        // begun, ever
  int64_t taken_at_ = 0;     // steps_ at the last take
  StepTimes host_sums_;      // since the last take
  double step_input_ms_ = 0;
  Clock::time_point start_, backward_done_;
};

}  // namespace trainer
