// RAII scope for automatic mixed precision: inside it, convolutions and matmuls run in fp16 or
// bf16 while reductions and the loss stay fp32 (LibTorch's autocast, as torch.autocast in Python).
#pragma once

#include <ATen/autocast_mode.h>

#include <optional>

namespace trainer {

class AutocastGuard {
 public:
  // dtype: kHalf or kBFloat16 to enable; nullopt leaves autocast off (fp32).
  AutocastGuard(c10::DeviceType device_type, std::optional<at::ScalarType> dtype)
      : device_type_(device_type), active_(dtype.has_value()) {
    if (!active_) return;
    previous_enabled_ = at::autocast::is_autocast_enabled(device_type);
    previous_dtype_ = at::autocast::get_autocast_dtype(device_type);
    at::autocast::set_autocast_enabled(device_type, true);
    at::autocast::set_autocast_dtype(device_type, *dtype);
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (!active_) return;
    // The weight casts cached inside the scope are freed when the outermost scope closes.
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(device_type_, previous_enabled_);
    at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_type_;
  bool active_;
  bool previous_enabled_ = false;
  at::ScalarType previous_dtype_ = at::kFloat;
};

}  // namespace trainer
