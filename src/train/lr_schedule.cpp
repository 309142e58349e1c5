#include "src/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace trainer {

double peak_lr(double base_lr, int64_t images_per_step) {
  return base_lr * static_cast<double>(images_per_step) / 256.0;
}

LrSchedule::LrSchedule(const LrScheduleOptions& o, int64_t samples_per_epoch)
    : kind_(o.kind),
      peak_(peak_lr(o.base_lr, o.images_per_step)),
      warmup_samples_(std::llround(o.warmup_epochs * static_cast<double>(samples_per_epoch))),
      total_samples_(o.epochs * samples_per_epoch),
      gamma_(o.step_gamma),
      power_(o.poly_power) {
  for (int64_t epoch : o.step_epochs) milestones_.push_back(epoch * samples_per_epoch);
}

double LrSchedule::at(int64_t trained, int64_t step_samples) const {
  // Warmup counts the step's own images, so its first step is never at 0 and the step that
  // completes warmup reaches the peak.
  if (trained < warmup_samples_)
    return peak_ * std::min(1.0, static_cast<double>(trained + step_samples) / warmup_samples_);
  const double decay = static_cast<double>(std::max<int64_t>(total_samples_ - warmup_samples_, 1));
  const double progress = std::min(1.0, static_cast<double>(trained - warmup_samples_) / decay);
  if (kind_ == LrScheduleKind::kCosine) return 0.5 * peak_ * (1.0 + std::cos(M_PI * progress));
  if (kind_ == LrScheduleKind::kPoly) return peak_ * std::pow(1.0 - progress, power_);
  const auto passed = std::upper_bound(milestones_.begin(), milestones_.end(), trained) -
                      milestones_.begin();  // step schedule
  return peak_ * std::pow(gamma_, static_cast<double>(passed));
}

}  // namespace trainer
