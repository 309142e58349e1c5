#include "src/train/step_timer.h"

#include <c10/cuda/CUDAGraphsC10Utils.h>

#include <algorithm>
#include <cmath>

namespace trainer {
namespace {

// A stream being recorded into a CUDA graph cannot time its events.
bool recording_graph() {
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}

double ms_between(std::chrono::steady_clock::time_point a,
                  std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

StepTimer::StepTimer(c10::Device device) {
  if (!device.is_cuda()) return;
  ring_.reserve(kTimedSteps);
  for (size_t i = 0; i < kTimedSteps; ++i) ring_.emplace_back();
}

void StepTimer::begin() {
  ++steps_;
  start_ = Clock::now();
  step_input_ms_ = 0;
  if (ring_.empty()) return;
  Timed& step = current();
  step.start.record();
  step.input_ms = 0;
  step.complete = step.has_reduce = step.replayed = false;
}

void StepTimer::add_input_wait(double ms) {
  step_input_ms_ += ms;
  host_sums_.input_ms += ms;
  if (!ring_.empty()) current().input_ms += ms;
}

void StepTimer::backward_done() {
  backward_done_ = Clock::now();
  host_sums_.compute_ms += std::max(0.0, ms_between(start_, backward_done_) - step_input_ms_);
  if (ring_.empty() || recording_graph()) return;
  current().backward_done.record();
  current().complete = true;
}

void StepTimer::reduced() {
  host_sums_.allreduce_ms += ms_between(backward_done_, Clock::now());
  if (ring_.empty() || recording_graph()) return;
  current().reduced.record();
  current().has_reduce = true;
}

void StepTimer::replayed() {
  if (ring_.empty()) return;
  Timed& step = current();
  step.backward_done.record();
  step.complete = step.replayed = true;
}

StepTimes StepTimer::take() {
  const int64_t steps = steps_ - taken_at_;
  StepTimes mean = host_sums_;
  host_sums_ = {};
  taken_at_ = steps_;
  if (steps == 0) return {};
  mean.input_ms /= static_cast<double>(steps);
  mean.compute_ms /= static_cast<double>(steps);
  mean.allreduce_ms /= static_cast<double>(steps);
  if (ring_.empty()) return mean;
  // The device's own times, over the interval's last steps that were timed whole.
  double compute = 0, allreduce = 0;
  int64_t timed = 0;
  bool replayed = false;
  for (int64_t s = steps_; s > steps_ - std::min<int64_t>(steps, kTimedSteps); --s) {
    Timed& step = ring_[(s - 1) % ring_.size()];
    if (!step.complete) continue;
    if (timed == 0) (step.has_reduce ? step.reduced : step.backward_done).synchronize();
    compute += std::max(0.0, step.start.elapsed_time(step.backward_done) - step.input_ms);
    if (step.has_reduce) allreduce += step.backward_done.elapsed_time(step.reduced);
    replayed = replayed || step.replayed;
    ++timed;
  }
  if (timed == 0) return mean;
  mean.compute_ms = compute / static_cast<double>(timed);
  mean.allreduce_ms = replayed ? std::nan("") : allreduce / static_cast<double>(timed);
  return mean;
}

}  // namespace trainer
