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
#include "src/train/lr_schedule.h"

namespace trainer {

// Note [EMA buffers]
// What the average holds of the BN running statistics (ema_buffers):
// - copy (the default): only parameters are averaged; the statistics are the trained model's,
//   copied into the average when it is read (evaluation, checkpoints), as the recipes that cite
//   "BN buffers copied" do: the statistics are themselves running averages.
// - average: the floating-point statistics are averaged with the parameters, as torchvision's
//   ExponentialMovingAverage (an AveragedModel with use_buffers=True) does for its recipe. The
//   batch counter (num_batches_tracked) is copied: eval-mode BN does not read it.
// Each rank updates its own average from the same all-reduced weights, so the parameters' averages
// stay equal. Statistics differ per rank (each rank's own batches): the model's are broadcast from
// rank 0 before they are read (Trainer::sync_buffers), and in `average` mode so are the
// average's, in place, so that every rank evaluates and saves the same average.

// Which of the average's tensors follow the trained model's BN statistics.
enum class EmaBuffers { kCopy, kAverage };

class WeightAverage {
 public:
  // `average` is a fresh model of `model`'s architecture on its device and memory format; it
  // starts as a copy of `model`'s weights. `decay` is per update, in (0, 1); updated every
  // `every_steps` steps.
  WeightAverage(ResNet& model, ResNet average, double decay, int64_t every_steps,
                EmaBuffers buffers = EmaBuffers::kCopy);

  // After optimisation step `step` (1-based, counting resumed steps): on every k-th, average =
  // decay x average + (1 - decay) x weights, as one fused device operation; or, with `copy`
  // (Note [EMA warmup reset]), average = weights.
  void update(int64_t step, bool copy = false);
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
  // The BN statistics that differ per rank and are broadcast from rank 0 before a read: none in
  // `copy` mode (the model's own are), the average's in `average` mode.
  std::vector<at::Tensor> rank_local_buffers();

 private:
  void copy_buffers();

  ResNet& model_;
  ResNet average_;
  EmaBuffers buffers_;
  // The tensors averaged, the same order in both: parameters, and in `average` mode the
  // floating-point buffers.
  std::vector<at::Tensor> model_tensors_, average_tensors_;
  double decay_;
  int64_t every_steps_;
};

// Whether, with ema_warmup_reset, the EMA update of the step after `trained` images copies the
// weights (Note [EMA warmup reset]): when that step or the previous update's, `images_per_update`
// earlier, is in `schedule`'s warmup. Before the run counts as warmup: the first update copies,
// as AveragedModel's does.
bool warmup_update_copies(const LrSchedule& schedule, int64_t trained, int64_t images_per_update);

// The decay per update that halves a weight's share after `half_life_images` images, with
// `images_per_update` images trained between updates.
double decay_for_half_life(double half_life_images, double images_per_update);

}  // namespace trainer
