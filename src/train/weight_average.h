// An exponential moving average (EMA) of the model's weights, kept on the device in a second
// model of the same architecture and layout, updated every k steps without waiting for the
// device. Evaluated beside the trained weights, saved in checkpoints as its own torchvision state
// dict (Note [EMA buffers]).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "models/resnet.h"
#include "src/state/checkpoint.h"

namespace trainer {

// Note [EMA buffers]
// Only parameters are averaged. The BN running statistics are the trained model's, copied into
// the average when it is read (evaluation, checkpoints), as the recipes that cite "BN buffers
// copied" do: the statistics are themselves running averages, and the model's have been synced
// across ranks at that point (Trainer::sync_buffers), so every rank reads the same average. Every
// rank updates its own average from the same all-reduced weights, so the averages stay equal.

class WeightAverage {
 public:
  // `average` is a fresh model of `model`'s architecture on its device and memory format; it
  // starts as a copy of `model`'s weights. `decay` is per update, in (0, 1); updated every
  // `every_steps` steps.
  WeightAverage(ResNet& model, ResNet average, double decay, int64_t every_steps);

  // After optimisation step `step` (1-based, counting resumed steps): on every k-th, average =
  // decay x average + (1 - decay) x weights, as one fused device operation.
  void update(int64_t step);
  // The decay per update, e.g. after a resize changed the images per step (half-life in images).
  void set_decay(double decay) { decay_ = decay; }
  double decay() const { return decay_; }

  // The average with the trained model's BN statistics (Note [EMA buffers]), to evaluate.
  ResNet& model_for_evaluation();
  // Its state dict (parameters and buffers, torchvision names, CPU) and the way back.
  TensorMap state();
  void load(const TensorMap& state);
  // Starts again from the trained model's weights (a run that turns EMA on mid-way).
  void reset();

 private:
  void copy_buffers();

  ResNet& model_;
  ResNet average_;
  std::vector<at::Tensor> model_parameters_, average_parameters_;  // the same order
  double decay_;
  int64_t every_steps_;
};

// The decay per update that halves a weight's share after `half_life_images` images, with
// `images_per_update` images trained between updates.
double decay_for_half_life(double half_life_images, double images_per_update);

}  // namespace trainer
