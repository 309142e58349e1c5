// Learning rate per step: the linear scaling rule (base LR per 256 images x global batch / 256),
// linear warmup from ~0 to that peak, then cosine, step or polynomial decay to the end of training.
// Progress is counted in images trained, not steps, so warmup and decay land at the same fraction
// of training whatever the world size or batch size, also across an elastic resume. Computed on
// the host, so it needs no device synchronisation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainer {

enum class LrScheduleKind { kCosine, kStep, kPoly };

struct LrScheduleOptions {
  LrScheduleKind kind = LrScheduleKind::kCosine;
  double base_lr = 0.1;              // per 256 images
  int64_t images_per_step = 256;     // over all ranks: the peak is base_lr x images_per_step / 256
  double warmup_epochs = 5;          // linear warmup, in epochs (fractions allowed)
  int64_t epochs = 90;               // the whole run
  std::vector<int64_t> step_epochs;  // step: epochs after which the LR is multiplied by gamma
  double step_gamma = 0.1;           // step: the multiplier
  double poly_power = 2.0;           // poly: (1 - progress)^power
};

// The linear scaling rule's peak: `base_lr` per 256 images, for a step of `images_per_step`.
double peak_lr(double base_lr, int64_t images_per_step);

class LrSchedule {
 public:
  // `samples_per_epoch`: images in one training epoch.
  LrSchedule(const LrScheduleOptions& options, int64_t samples_per_epoch);
  // LR of the step that trains `step_samples` images after `trained` images of the whole run.
  double at(int64_t trained, int64_t step_samples) const;
  // Whether the step after `trained` images is in the warmup (negative `trained`: before the run).
  bool warming_up(int64_t trained) const { return trained < warmup_samples_; }
  double peak() const { return peak_; }
  int64_t total_samples() const { return total_samples_; }

 private:
  LrScheduleKind kind_;
  double peak_;
  int64_t warmup_samples_;
  int64_t total_samples_;
  std::vector<int64_t> milestones_;  // step schedule: images after which the LR is x gamma
  double gamma_;
  double power_;
};

}  // namespace trainer
