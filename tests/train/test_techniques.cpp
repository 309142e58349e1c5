// The recipes' techniques as units: MixUp/CutMix draws (deterministic per seed, torchvision's
// box, both kinds when both are on), the EMA's update rule and half-life, and BlurPool's blur.
// Their numerics beside torchvision, timm and FFCV: tests/train/test_technique_parity.py.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "models/resnet.h"
#include "src/state/checkpoint.h"
#include "src/train/batch_mixing.h"
#include "src/train/weight_average.h"

namespace trainer {
namespace {

TEST(BatchMixing, DrawsAreAFunctionOfTheSeed) {
  const MixingOptions both{0.2, 1.0};
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const MixDraw a = draw_mix(both, seed, 24, 32), b = draw_mix(both, seed, 24, 32);
    EXPECT_EQ(a.kind, b.kind);
    EXPECT_EQ(a.lam, b.lam);
    EXPECT_EQ(std::tie(a.x1, a.y1, a.x2, a.y2), std::tie(b.x1, b.y1, b.x2, b.y2));
  }
  EXPECT_EQ(draw_mix(MixingOptions{}, 1, 24, 32).kind, MixKind::kNone);
}

TEST(BatchMixing, BothOnTakesEachAboutHalfTheTime) {
  int cutmix = 0;
  constexpr int kDraws = 2000;
  for (uint64_t seed = 0; seed < kDraws; ++seed)
    cutmix += draw_mix(MixingOptions{0.2, 1.0}, seed, 24, 32).kind == MixKind::kCutMix;
  EXPECT_NEAR(double(cutmix) / kDraws, 0.5, 0.05);
}

TEST(BatchMixing, CutMixBoxIsTorchvisionsAndLamItsArea) {
  double lam_sum = 0;
  constexpr int kDraws = 2000;
  for (uint64_t seed = 0; seed < kDraws; ++seed) {
    const MixDraw d = draw_mix(MixingOptions{0, 1.0}, seed, 24, 32);
    ASSERT_EQ(d.kind, MixKind::kCutMix);
    ASSERT_TRUE(0 <= d.x1 && d.x1 <= d.x2 && d.x2 <= 32 && 0 <= d.y1 && d.y1 <= d.y2 && d.y2 <= 24);
    EXPECT_DOUBLE_EQ(d.lam, 1.0 - double((d.x2 - d.x1) * (d.y2 - d.y1)) / (24 * 32));
    lam_sum += d.lam;
  }
  // Beta(1, 1) is uniform: before clipping the box keeps lam = 0.5 on average; clipping at the
  // borders only shrinks boxes, so the area left is a little more than half.
  EXPECT_GT(lam_sum / kDraws, 0.5);
  EXPECT_LT(lam_sum / kDraws, 0.75);
}

TEST(BatchMixing, MixUpMixesWithThePreviousImage) {
  const at::Tensor images = torch::arange(4 * 3 * 2 * 2, torch::kFloat).reshape({4, 3, 2, 2});
  const at::Tensor targets = torch::eye(4);
  MixDraw draw;
  draw.kind = MixKind::kMixUp;
  draw.lam = 0.75;
  const auto [mixed, soft] = apply_mix(draw, images, targets);
  EXPECT_TRUE(torch::allclose(mixed[1], 0.75 * images[1] + 0.25 * images[0]));
  EXPECT_TRUE(torch::allclose(mixed[0], 0.75 * images[0] + 0.25 * images[3]));
  EXPECT_TRUE(torch::allclose(soft.sum(1), torch::ones({4})));
  EXPECT_FLOAT_EQ(soft[1][0].item<float>(), 0.25f);
}

TEST(WeightAverage, UpdatesEveryKStepsByTheDecay) {
  torch::manual_seed(0);
  ResNet model(ResNetOptions{18, 3});
  WeightAverage ema(model, ResNet(ResNetOptions{18, 3}), /*decay=*/0.9, /*every_steps=*/2);
  const at::Tensor start = model->named_parameters()["fc.weight"].detach().clone();
  {
    torch::NoGradGuard no_grad;
    model->named_parameters()["fc.weight"].add_(1.0);
  }
  auto averaged = [&] { return ema.state().at("fc.weight"); };
  ema.update(/*step=*/1);  // not a multiple of 2: no update
  EXPECT_TRUE(torch::equal(averaged(), start));
  ema.update(/*step=*/2);
  EXPECT_TRUE(torch::allclose(averaged(), start + 0.1, 1e-6, 1e-6));
  // BN statistics are the model's, not averaged (Note [EMA buffers]).
  {
    torch::NoGradGuard no_grad;
    model->named_buffers()["bn1.running_mean"].fill_(3.0);
  }
  EXPECT_TRUE(torch::equal(ema.state().at("bn1.running_mean"), torch::full({64}, 3.0)));
}

TEST(WeightAverage, HalfLifeInImages) {
  const double decay = decay_for_half_life(/*half_life_images=*/1000, /*images_per_update=*/256);
  EXPECT_NEAR(std::pow(decay, 1000.0 / 256.0), 0.5, 1e-12);
}

TEST(BlurPool, BlurKeepsFlatRegionsAndTheStateDict) {
  Blur blur;
  const at::Tensor flat = torch::full({1, 4, 6, 6}, 2.0);
  const at::Tensor out = blur(flat);
  EXPECT_TRUE(torch::allclose(out.slice(2, 1, 5).slice(3, 1, 5), torch::full({1, 4, 4, 4}, 2.0)));
  // The variant's parameters and buffers are the plain model's: torchvision loads them.
  const TensorMap plain = state_dict(*ResNet(ResNetOptions{50, 10}));
  const TensorMap blurred = state_dict(*ResNet(ResNetOptions{50, 10, false, /*blurpool=*/true}));
  ASSERT_EQ(plain.size(), blurred.size());
  for (const auto& [name, tensor] : plain)
    EXPECT_EQ(blurred.at(name).sizes(), tensor.sizes()) << name;
}

}  // namespace
}  // namespace trainer
