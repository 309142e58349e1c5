// Dynamic loss scaling for fp16: the loss is multiplied by the scale before backward; gradients
// are unscaled and checked for inf/NaN on the device; a step with non-finite gradients is skipped
// by the optimizer and halves the scale; `growth_interval` clean steps in a row double it.
// Everything stays on the device (PyTorch's _amp_* kernels): no host synchronisation per step.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <optional>
#include <vector>

namespace trainer {

struct LossScalerOptions {
  bool enabled = false;  // fp16 only; fp32 and bf16 need no scaling
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class LossScaler {
 public:
  LossScaler(const LossScalerOptions& options, c10::Device device);

  bool enabled() const { return options_.enabled; }
  // loss x scale (the loss itself when disabled).
  at::Tensor scale(const at::Tensor& loss) const;
  // Divides every gradient by the scale in place and records in found_inf() whether any is
  // inf/NaN. No-op when disabled.
  void unscale_(const std::vector<at::Tensor>& grads);
  // 0-dim float on the device, 1 when this step's gradients overflowed; nullopt when disabled.
  std::optional<at::Tensor> found_inf() const;
  // Halves or grows the scale from found_inf() and resets it for the next step.
  void update();

  // Host reads: they synchronise, so call them only at log intervals and checkpoints.
  double scale_value() const;
  int64_t growth_tracker_value() const;
  int64_t skipped_steps_value() const;  // steps skipped for overflow since this process started
  void load(double scale, int64_t growth_tracker);

 private:
  LossScalerOptions options_;
  at::Tensor scale_;           // 0-dim float32, current scale
  at::Tensor growth_tracker_;  // 0-dim int32, clean steps since the last change
  at::Tensor found_inf_;       // 0-dim float32, 1 if the current step overflowed
  at::Tensor skipped_;         // 0-dim float32, steps skipped so far (exact up to 2^24)
};

}  // namespace trainer
