// Learning-rate schedule values at chosen steps: linear scaling, warmup, cosine / step / poly.
#include <gtest/gtest.h>

#include <cmath>

#include "src/config.h"
#include "src/lr_schedule.h"

namespace trainer {
namespace {

Config schedule_config(const std::string& kind) {
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

constexpr int64_t kStepsPerEpoch = 100;

TEST(LrSchedule, LinearScalingRuleAndWarmup) {
  LrSchedule s(schedule_config("cosine"), kStepsPerEpoch);
  EXPECT_DOUBLE_EQ(s.peak(), 0.2);
  EXPECT_EQ(s.total_steps(), 1000);
  EXPECT_DOUBLE_EQ(s.at(0), 0.2 * 1 / 200);
  EXPECT_DOUBLE_EQ(s.at(99), 0.2 * 100 / 200);
  EXPECT_DOUBLE_EQ(s.at(199), 0.2);  // the last warmup step reaches the peak
}

TEST(LrSchedule, CosineDecay) {
  LrSchedule s(schedule_config("cosine"), kStepsPerEpoch);
  EXPECT_DOUBLE_EQ(s.at(200), 0.2);
  EXPECT_NEAR(s.at(600), 0.1, 1e-12);  // halfway through the decay
  EXPECT_NEAR(s.at(999), 0.5 * 0.2 * (1 + std::cos(M_PI * 799.0 / 800.0)), 1e-12);
}

TEST(LrSchedule, StepDecay) {
  LrSchedule s(schedule_config("step"), kStepsPerEpoch);
  EXPECT_DOUBLE_EQ(s.at(499), 0.2);
  EXPECT_NEAR(s.at(500), 0.02, 1e-12);
  EXPECT_NEAR(s.at(799), 0.02, 1e-12);
  EXPECT_NEAR(s.at(800), 0.002, 1e-12);
}

TEST(LrSchedule, PolynomialDecay) {
  LrSchedule s(schedule_config("poly"), kStepsPerEpoch);
  EXPECT_NEAR(s.at(600), 0.2 * 0.25, 1e-12);  // (1 - 1/2)^2
  EXPECT_NEAR(s.at(1000), 0.0, 1e-12);
}

TEST(LrSchedule, NoWarmup) {
  Config c = schedule_config("cosine");
  c.warmup_epochs = 0;
  LrSchedule s(c, kStepsPerEpoch);
  EXPECT_DOUBLE_EQ(s.at(0), 0.2);
}

}  // namespace
}  // namespace trainer
