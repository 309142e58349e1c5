// Learning rate per step: the linear scaling rule (base LR per 256 images x global batch / 256),
// linear warmup from ~0 to that peak, then cosine, step or polynomial decay to the end of training.
// Computed on the host from the step number, so it needs no device synchronisation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainer {

struct Config;

class LrSchedule {
 public:
  LrSchedule(const Config& config, int64_t steps_per_epoch);
  double at(int64_t step) const;  // LR for 0-based global `step`
  double peak() const { return peak_; }
  int64_t total_steps() const { return total_steps_; }

 private:
  std::string kind_;
  double peak_;
  int64_t warmup_steps_;
  int64_t total_steps_;
  std::vector<int64_t> milestones_;  // step schedule: steps where the LR is multiplied by gamma
  double gamma_;
  double power_;
};

}  // namespace trainer
