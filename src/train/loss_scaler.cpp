#include "src/train/loss_scaler.h"

#include <ATen/ATen.h>

namespace trainer {

LossScaler::LossScaler(const LossScalerOptions& options, c10::Device device) : options_(options) {
  auto f32 = at::TensorOptions().device(device).dtype(at::kFloat);
  scale_ = at::full({}, options.init_scale, f32);
  growth_tracker_ = at::zeros({}, f32.dtype(at::kInt));
  found_inf_ = at::zeros({}, f32);
  skipped_ = at::zeros({}, f32);
}

at::Tensor LossScaler::scale(const at::Tensor& loss) const {
  return options_.enabled ? loss * scale_ : loss;
}

void LossScaler::unscale_(const std::vector<at::Tensor>& grads) {
  if (!options_.enabled || grads.empty()) return;
  at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf_, scale_.reciprocal());
}

std::optional<at::Tensor> LossScaler::found_inf() const {
  if (!options_.enabled) return std::nullopt;
  return found_inf_;
}

void LossScaler::update() {
  if (!options_.enabled) return;
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, options_.growth_factor,
                         options_.backoff_factor, options_.growth_interval);
  skipped_.add_(found_inf_);
  found_inf_.zero_();
}

double LossScaler::scale_value() const { return scale_.item<double>(); }

int64_t LossScaler::growth_tracker_value() const { return growth_tracker_.item<int64_t>(); }

int64_t LossScaler::skipped_steps_value() const { return skipped_.item<int64_t>(); }

void LossScaler::load(double scale, int64_t growth_tracker) {
  scale_.fill_(scale);
  growth_tracker_.fill_(growth_tracker);
}

}  // namespace trainer
