// Learning-rate schedule values at chosen steps: linear scaling, warmup, cosine / step / poly, and
// progress counted in images, so another global batch lands warmup and decay at the same point.
#include <gtest/gtest.h>

#include <cmath>

#include "src/config/config.h"
#include "src/part_options.h"
#include "src/train/lr_schedule.h"

namespace trainer {
namespace {

Config schedule_config(LrScheduleKind kind) {
  Config c;
  c.batch_size = 128;
  c.world_size = 4;  // global batch 512: peak = base_lr x 2
  c.base_lr = 0.1;
  c.epochs = 10;
  c.warmup_epochs = 2;
  c.lr_schedule = kind;
  c.lr_step_epochs = {5, 8};
  c.lr_step_gamma = 0.1;
  c.lr_poly_power = 2;
  return c;
}

constexpr int64_t kGlobalBatch = 512;
constexpr int64_t kSamplesPerEpoch = 100 * kGlobalBatch;  // 100 steps per epoch

// The LR of `step` when every step trains one full global batch.
double at_step(const LrSchedule& s, int64_t step) {
  return s.at(step * kGlobalBatch, kGlobalBatch);
}

TEST(LrSchedule, LinearScalingRuleAndWarmup) {
  LrSchedule s(lr_schedule_options(schedule_config(LrScheduleKind::kCosine)), kSamplesPerEpoch);
  EXPECT_DOUBLE_EQ(s.peak(), 0.2);
  EXPECT_EQ(s.total_samples(), 1000 * kGlobalBatch);
  EXPECT_DOUBLE_EQ(at_step(s, 0), 0.2 * 1 / 200);
  EXPECT_DOUBLE_EQ(at_step(s, 99), 0.2 * 100 / 200);
  EXPECT_DOUBLE_EQ(at_step(s, 199), 0.2);  // the last warmup step reaches the peak
}

TEST(LrSchedule, CosineDecay) {
  LrSchedule s(lr_schedule_options(schedule_config(LrScheduleKind::kCosine)), kSamplesPerEpoch);
  EXPECT_DOUBLE_EQ(at_step(s, 200), 0.2);
  EXPECT_NEAR(at_step(s, 600), 0.1, 1e-12);  // halfway through the decay
  EXPECT_NEAR(at_step(s, 999), 0.5 * 0.2 * (1 + std::cos(M_PI * 799.0 / 800.0)), 1e-12);
}

TEST(LrSchedule, StepDecay) {
  LrSchedule s(lr_schedule_options(schedule_config(LrScheduleKind::kStep)), kSamplesPerEpoch);
  EXPECT_DOUBLE_EQ(at_step(s, 499), 0.2);
  EXPECT_NEAR(at_step(s, 500), 0.02, 1e-12);
  EXPECT_NEAR(at_step(s, 799), 0.02, 1e-12);
  EXPECT_NEAR(at_step(s, 800), 0.002, 1e-12);
}

TEST(LrSchedule, PolynomialDecay) {
  LrSchedule s(lr_schedule_options(schedule_config(LrScheduleKind::kPoly)), kSamplesPerEpoch);
  EXPECT_NEAR(at_step(s, 600), 0.2 * 0.25, 1e-12);  // (1 - 1/2)^2
  EXPECT_NEAR(at_step(s, 1000), 0.0, 1e-12);
}

TEST(LrSchedule, NoWarmup) {
  Config c = schedule_config(LrScheduleKind::kCosine);
  c.warmup_epochs = 0;
  LrSchedule s(lr_schedule_options(c), kSamplesPerEpoch);
  EXPECT_DOUBLE_EQ(at_step(s, 0), 0.2);
}

TEST(LrSchedule, AnotherGlobalBatchKeepsTheScheduleInImages) {
  // 6 ranks instead of 4 (global batch 768): the peak scales with the batch, and the LR at the
  // same number of images trained is the same fraction of it, in warmup and in decay.
  Config six = schedule_config(LrScheduleKind::kCosine);
  six.world_size = 6;
  const LrSchedule four_ranks(lr_schedule_options(schedule_config(LrScheduleKind::kCosine)),
                              kSamplesPerEpoch);
  const LrSchedule six_ranks(lr_schedule_options(six), kSamplesPerEpoch);
  EXPECT_DOUBLE_EQ(six_ranks.peak(), 0.3);
  for (int64_t trained : {0L, 3072L, 50000L}) {  // warmup counts the step's own images
    EXPECT_NEAR(six_ranks.at(trained, 768) / six_ranks.peak(),
                four_ranks.at(trained + 256, 512) / four_ranks.peak(), 1e-12)
        << trained;  // both steps end at trained + 768 images
  }
  for (int64_t trained : {102400L, 200000L, 400000L, 511000L}) {  // decay: from the step's start
    EXPECT_NEAR(six_ranks.at(trained, 768) / six_ranks.peak(),
                four_ranks.at(trained, 512) / four_ranks.peak(), 1e-12)
        << trained;
  }
}

TEST(LrSchedule, ShortStepAtTheEndOfWarmup) {
  // A short last step of an epoch still counts only the images it trains.
  LrSchedule s(lr_schedule_options(schedule_config(LrScheduleKind::kCosine)), kSamplesPerEpoch);
  EXPECT_DOUBLE_EQ(s.at(2 * kSamplesPerEpoch - 512, 100), 0.2 * (102400.0 - 412) / 102400);
}

}  // namespace
}  // namespace trainer
