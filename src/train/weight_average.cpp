#include "src/train/weight_average.h"

#include <ATen/ATen.h>

#include <cmath>

namespace trainer {
namespace {

std::vector<at::Tensor> parameter_data(torch::nn::Module& module) {
  std::vector<at::Tensor> out;
  for (const auto& p : module.parameters()) out.push_back(p.data());
  return out;
}

}  // namespace

WeightAverage::WeightAverage(ResNet& model, ResNet average, double decay, int64_t every_steps)
    : model_(model), average_(std::move(average)), decay_(decay), every_steps_(every_steps) {
  for (auto& p : average_->parameters()) p.set_requires_grad(false);
  average_->eval();
  model_parameters_ = parameter_data(*model_);
  average_parameters_ = parameter_data(*average_);
  TORCH_INTERNAL_ASSERT(model_parameters_.size() == average_parameters_.size());
  reset();
}

void WeightAverage::reset() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < model_parameters_.size(); ++i)
    average_parameters_[i].copy_(model_parameters_[i]);
  copy_buffers();
}

void WeightAverage::update(int64_t step) {
  if (step % every_steps_ != 0) return;
  at::NoGradGuard no_grad;
  // lerp: average + (1 - decay) (weights - average) = decay average + (1 - decay) weights.
  at::_foreach_lerp_(average_parameters_, model_parameters_, 1.0 - decay_);
}

void WeightAverage::copy_buffers() {
  at::NoGradGuard no_grad;
  const auto from = model_->buffers();
  const auto to = average_->buffers();
  for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
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

double decay_for_half_life(double half_life_images, double images_per_update) {
  return std::pow(0.5, images_per_update / half_life_images);
}

}  // namespace trainer
