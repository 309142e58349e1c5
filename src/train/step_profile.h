// Where a training step's time goes. StepPhase marks a phase of the step (forward, backward,
// all-reduce, optimizer, ...) as an NVTX range, which Nsight Systems shows on the timeline, and as
// a profiler scope. StepProfiler records steps [first_step, first_step + steps) with LibTorch's
// Kineto profiler (host ops, and on the GPU every kernel with its stream) and saves one Chrome
// trace per rank, which Perfetto (ui.perfetto.dev), chrome://tracing and TensorBoard's profiler
// plugin open.
#pragma once

#include <ATen/record_function.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>

namespace trainer {

class StepPhase {
 public:
  explicit StepPhase(const std::string& name);  // "step 12", "forward", ...
  ~StepPhase();
  StepPhase(const StepPhase&) = delete;
  StepPhase& operator=(const StepPhase&) = delete;

 private:
  at::RecordFunction scope_;
};

struct ProfileOptions {
  int64_t first_step = 20;  // step numbers as the log counts them, from 1
  int64_t steps = 0;        // 0: off
  std::string dir;          // the traces: <dir>/rank<R>.<first_step>.pt.trace.json
};

class StepProfiler {
 public:
  StepProfiler(ProfileOptions options, c10::Device device, int rank);
  // A run that ends inside the window (a stop signal, the last step) saves what it recorded.
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  void before_step(int64_t step);  // starts recording at first_step
  void after_step(int64_t step);   // saves after the window's last step

  // The trace file for this rank.
  std::string trace_path() const;

 private:
  void save();

  ProfileOptions options_;
  c10::Device device_;
  int rank_;
  bool recording_ = false;
};

}  // namespace trainer
