#include "src/train/step_profile.h"

#include <c10/cuda/CUDAFunctions.h>
#include <nvtx3/nvToolsExt.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <filesystem>
#include <set>
#include <utility>

namespace trainer {

namespace profiler = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;

StepPhase::StepPhase(const std::string& name) : scope_(at::RecordScope::USER_SCOPE) {
  nvtxRangePushA(name.c_str());  // a no-op unless a tool (Nsight Systems) is attached
  if (scope_.isActive()) scope_.before(name);
}

StepPhase::~StepPhase() { nvtxRangePop(); }

StepProfiler::StepProfiler(ProfileOptions options, c10::Device device, int rank)
    : options_(std::move(options)), device_(device), rank_(rank) {}

StepProfiler::~StepProfiler() {
  if (!recording_) return;
  try {
    save();
  } catch (const std::exception& e) {  // a destructor must not throw; the run's error wins
    spdlog::warn("the profiler trace was not saved: {}", e.what());
  }
}

std::string StepProfiler::trace_path() const {
  // TensorBoard's profiler plugin reads <worker>.<span>.pt.trace.json.
  return (std::filesystem::path(options_.dir) /
          ("rank" + std::to_string(rank_) + "." + std::to_string(options_.first_step) +
           ".pt.trace.json"))
      .string();
}

void StepProfiler::before_step(int64_t step) {
  if (options_.steps <= 0 || step != options_.first_step) return;
  std::set<ActivityType> activities{ActivityType::CPU};
  if (device_.is_cuda()) activities.insert(ActivityType::CUDA);
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO,
                                                     /*report_input_shapes=*/true);
  profiler::prepareProfiler(config, activities);
  profiler::enableProfiler(config, activities);
  recording_ = true;
  spdlog::info("profiling steps {}-{} into {}", step, step + options_.steps - 1, trace_path());
}

void StepProfiler::after_step(int64_t step) {
  if (recording_ && step == options_.first_step + options_.steps - 1) save();
}

void StepProfiler::save() {
  recording_ = false;
  // The window's kernels finish before the profiler collects them: one wait, once a run.
  if (device_.is_cuda()) c10::cuda::device_synchronize();
  std::unique_ptr<profiler::ProfilerResult> result = profiler::disableProfiler();
  std::filesystem::create_directories(options_.dir);
  result->save(trace_path());
  spdlog::info("profile of {} steps saved: {} (Perfetto, chrome://tracing, TensorBoard)",
               options_.steps, trace_path());
}

}  // namespace trainer
