// One model replica and its optimisation state on one device: the training step (device input,
// mixed-precision forward, scaled backward, fused update), evaluation, and checkpoint state.
// Nothing here waits for the device: losses and counts stay device tensors until a caller reads.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/MemoryFormat.h>

#include <memory>
#include <optional>

#include "data/batch_source.h"
#include "models/resnet.h"
#include "src/checkpoint.h"
#include "src/config.h"
#include "src/loss_scaler.h"
#include "src/optimizer.h"

namespace trainer {

struct EvalResult {
  int64_t images = 0;
  int64_t top1_correct = 0;
  int64_t top5_correct = 0;
  double top1() const { return images ? 100.0 * top1_correct / images : 0.0; }  // percent
  double top5() const { return images ? 100.0 * top5_correct / images : 0.0; }  // percent
};

class Trainer {
 public:
  // Builds the model from `config` (seeded by config.seed) on `device`.
  Trainer(const Config& config, c10::Device device);

  // One optimisation step on `batch` at learning rate `lr`. Returns the batch's mean loss, a
  // 0-dim float device tensor. In fp16, a step with overflowing gradients changes no weights.
  at::Tensor train_step(const Batch& batch, double lr);

  // Top-1/top-5 over every batch of one epoch of `source`, in eval mode (BN running statistics).
  EvalResult evaluate(BatchSource& source);

  // The state to save (reads the device) and to restore, at `step` steps into `epoch`.
  Checkpoint checkpoint(int64_t step, int64_t epoch) const;
  void restore(const Checkpoint& checkpoint);

  ResNet& model() { return model_; }
  const LossScaler& loss_scaler() const { return scaler_; }
  c10::Device device() const { return device_; }
  // Images of one batch prepared for the model: (N, 3, H, W) normalised, compute dtype and layout.
  at::Tensor prepare_images(const at::Tensor& images) const;

 private:
  const Config& config_;
  c10::Device device_;
  std::optional<at::ScalarType> autocast_dtype_;  // kHalf / kBFloat16; nullopt in fp32
  at::ScalarType input_dtype_;                    // dtype the images are normalised into
  c10::MemoryFormat memory_format_;               // channels_last on the GPU when enabled
  ResNet model_;
  std::unique_ptr<Optimizer> optimizer_;  // built after the model's final layout
  LossScaler scaler_;
};

}  // namespace trainer
