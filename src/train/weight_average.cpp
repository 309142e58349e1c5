#include "src/train/weight_average.h"

#include <ATen/ATen.h>

#include <cmath>

namespace trainer {
namespace {

// The parameters and, with `buffers`, the floating-point buffers, in module order.
std::vector<at::Tensor> averaged_tensors(torch::nn::Module& module, bool buffers) {
  std::vector<at::Tensor> out;
  for (const auto& p : module.parameters()) out.push_back(p.data());
  if (buffers)
    for (const auto& b : module.buffers())
      if (b.is_floating_point()) out.push_back(b);
  return out;
}

}  // namespace

WeightAverage::WeightAverage(ResNet& model, ResNet average, double decay, int64_t every_steps,
                             EmaBuffers buffers)
    : model_(model),
      average_(std::move(average)),
      buffers_(buffers),
      decay_(decay),
      every_steps_(every_steps) {
  for (auto& p : average_->parameters()) p.set_requires_grad(false);
  average_->eval();
  const bool with_buffers = buffers_ == EmaBuffers::kAverage;
  model_tensors_ = averaged_tensors(*model_, with_buffers);
  average_tensors_ = averaged_tensors(*average_, with_buffers);
  TORCH_INTERNAL_ASSERT(model_tensors_.size() == average_tensors_.size());
  reset();
}

void WeightAverage::reset() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < model_tensors_.size(); ++i) average_tensors_[i].copy_(model_tensors_[i]);
  copy_buffers();
}

// Note [EMA warmup reset]
// torchvision's train.py sets the average's update count back to 0 after each update in the LR
// warmup epochs, and AveragedModel copies the weights at an update whose count is 0: during
// warmup the average follows the weights, and so does its first update after the warmup and the
// first of the run. Which updates copy follows from the images trained (warmup_update_copies),
// so a resumed run decides the same.
void WeightAverage::update(int64_t step, bool copy) {
  if (step % every_steps_ != 0) return;
  if (copy) return reset();
  at::NoGradGuard no_grad;
  // lerp: average + (1 - decay) (weights - average) = decay average + (1 - decay) weights.
  at::_foreach_lerp_(average_tensors_, model_tensors_, 1.0 - decay_);
}

// The model's buffers that the average does not average: all in `copy` mode, the batch counter
// in `average` mode.
void WeightAverage::copy_buffers() {
  at::NoGradGuard no_grad;
  const auto from = model_->buffers();
  const auto to = average_->buffers();
  for (size_t i = 0; i < from.size(); ++i)
    if (buffers_ == EmaBuffers::kCopy || !to[i].is_floating_point()) to[i].copy_(from[i]);
}

std::vector<at::Tensor> WeightAverage::rank_local_buffers() {
  if (buffers_ == EmaBuffers::kCopy) return {};
  return average_->buffers();
}

ResNet& WeightAverage::model_for_evaluation() {
  copy_buffers();
  return average_;
}

TensorMap WeightAverage::state() {
  copy_buffers();
  return state_dict(*average_);
}

void WeightAverage::load(const TensorMap& state) {
  load_state_dict(*average_, state, "the checkpoint's EMA weights");
}

bool warmup_update_copies(const LrSchedule& schedule, int64_t trained, int64_t images_per_update) {
  return schedule.warming_up(trained) || schedule.warming_up(trained - images_per_update);
}

double decay_for_half_life(double half_life_images, double images_per_update) {
  return std::pow(0.5, images_per_update / half_life_images);
}

}  // namespace trainer
