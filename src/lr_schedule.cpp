#include "src/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "src/config.h"

namespace trainer {

LrSchedule::LrSchedule(const Config& config, int64_t steps_per_epoch)
    : kind_(config.lr_schedule),
      peak_(config.base_lr * static_cast<double>(config.global_batch()) / 256.0),
      warmup_steps_(std::llround(config.warmup_epochs * static_cast<double>(steps_per_epoch))),
      total_steps_(config.epochs * steps_per_epoch),
      gamma_(config.lr_step_gamma),
      power_(config.lr_poly_power) {
  for (int64_t epoch : config.lr_step_epochs) milestones_.push_back(epoch * steps_per_epoch);
}

double LrSchedule::at(int64_t step) const {
  // Warmup reaches the peak on its last step: (step + 1) / warmup, never 0.
  if (step < warmup_steps_) return peak_ * static_cast<double>(step + 1) / warmup_steps_;
  const double decay_steps =
      static_cast<double>(std::max<int64_t>(total_steps_ - warmup_steps_, 1));
  const double progress = std::min(1.0, static_cast<double>(step - warmup_steps_) / decay_steps);
  if (kind_ == "cosine") return 0.5 * peak_ * (1.0 + std::cos(M_PI * progress));
  if (kind_ == "poly") return peak_ * std::pow(1.0 - progress, power_);
  const auto passed = std::upper_bound(milestones_.begin(), milestones_.end(), step) -
                      milestones_.begin();  // step schedule
  return peak_ * std::pow(gamma_, static_cast<double>(passed));
}

}  // namespace trainer
