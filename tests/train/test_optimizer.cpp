// SGD and LARS updates against their formulas and LibTorch's reference SGD, weight-decay
// exclusion for BN and bias, and the fp16 loss scaler's skip / halve / grow behaviour.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>

#include "src/train/loss_scaler.h"
#include "src/train/optimizer.h"

namespace trainer {
namespace {

// A 2-D "weight" and a 1-D "bias", with fixed gradients.
struct Params {
  torch::Tensor weight = torch::tensor({{1.0f, -2.0f}, {0.5f, 3.0f}}).requires_grad_();
  torch::Tensor bias = torch::tensor({0.25f, -0.5f}).requires_grad_();
  Optimizer::NamedParameters named() const { return {{"fc.weight", weight}, {"fc.bias", bias}}; }
  void set_grads(float scale = 1.0f) {
    weight.mutable_grad() = torch::tensor({{0.1f, 0.2f}, {-0.3f, 0.4f}}) * scale;
    bias.mutable_grad() = torch::tensor({0.5f, -0.6f}) * scale;
  }
};

TEST(Optimizer, SgdMatchesLibTorchReferenceWhenEverythingDecays) {
  for (bool nesterov : {false, true}) {
    Params ours, ref;
    Optimizer opt(ours.named(),
                  {OptimizerKind::kSgd, 0.9, nesterov, 0.01, /*decay_bn_and_bias=*/true, 0});
    torch::optim::SGD reference(
        {ref.weight, ref.bias},
        torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(nesterov).weight_decay(0.01));
    for (int step = 0; step < 3; ++step) {  // a rate that changes each step, as schedules do
      const double lr = 0.1 / (step + 1);
      ours.set_grads(step + 1.0f);
      ref.set_grads(step + 1.0f);
      opt.set_lr(lr);
      opt.step();
      static_cast<torch::optim::SGDOptions&>(reference.param_groups()[0].options()).lr(lr);
      reference.step();
    }
    EXPECT_TRUE(torch::allclose(ours.weight, ref.weight, 1e-6, 1e-7)) << nesterov;
    EXPECT_TRUE(torch::allclose(ours.bias, ref.bias, 1e-6, 1e-7)) << nesterov;
  }
}

TEST(Optimizer, BnAndBiasGetNoWeightDecayByDefault) {
  Params p;
  Optimizer opt(p.named(), {OptimizerKind::kSgd, 0.0, false, 0.5, /*decay_bn_and_bias=*/false, 0});
  const torch::Tensor w0 = p.weight.detach().clone(), b0 = p.bias.detach().clone();
  p.set_grads();
  opt.set_lr(0.1);
  opt.step();
  EXPECT_TRUE(torch::allclose(p.weight, w0 - 0.1 * (p.weight.grad() + 0.5 * w0)));
  EXPECT_TRUE(torch::allclose(p.bias, b0 - 0.1 * p.bias.grad()));
}

TEST(Optimizer, LarsTrustRatioOnAKnownTensor) {
  torch::Tensor w = torch::tensor({3.0f, 4.0f});  // ||w|| = 5
  torch::Tensor g = torch::tensor({0.0f, 2.0f});  // ||g|| = 2
  torch::Tensor zero_grad = torch::zeros(2);
  auto ratios = lars_trust_ratios({w, w}, {g, zero_grad}, /*eta=*/0.001, /*weight_decay=*/0.1);
  EXPECT_NEAR(ratios[0].item<float>(), 0.001 * 5 / (2 + 0.1 * 5), 1e-9);
  EXPECT_EQ(ratios[1].item<float>(), 1.0f);  // no gradient: no scaling
}

TEST(Optimizer, LarsScalesWeightsAndLeavesBnAndBiasPlain) {
  Params p;
  const double eta = 0.02, wd = 0.01, lr = 0.5;
  Optimizer opt(p.named(),
                {OptimizerKind::kLars, 0.9, false, wd, /*decay_bn_and_bias=*/false, eta});
  const torch::Tensor w0 = p.weight.detach().clone(), b0 = p.bias.detach().clone();
  p.set_grads();
  const torch::Tensor gw = p.weight.grad().clone(), gb = p.bias.grad().clone();
  opt.set_lr(lr);
  opt.step();
  const double trust =
      eta * w0.norm().item<double>() / (gw.norm().item<double>() + wd * w0.norm().item<double>());
  EXPECT_TRUE(torch::allclose(p.weight, w0 - lr * trust * (gw + wd * w0), 1e-6, 1e-7));
  EXPECT_TRUE(torch::allclose(p.bias, b0 - lr * gb, 1e-6, 1e-7));
}

TEST(Optimizer, StepWithFoundInfChangesNothing) {
  for (const OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kLars}) {
    Params p;
    Optimizer opt(p.named(), {kind, 0.9, false, 0.01, false, 0.001});
    p.set_grads();
    opt.set_lr(0.1);
    opt.step();  // momentum buffers now non-zero
    const auto w1 = p.weight.detach().clone();
    const auto state1 = opt.state();
    p.set_grads();
    p.weight.mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
    opt.step(torch::ones({}));
    EXPECT_TRUE(torch::equal(p.weight, w1)) << static_cast<int>(kind);
    for (const auto& [name, buffer] : opt.state())
      EXPECT_TRUE(torch::equal(buffer, state1.at(name))) << static_cast<int>(kind) << " " << name;
  }
}

TEST(Optimizer, StateRoundTripsByParameterName) {
  Params p;
  Optimizer opt(p.named(), {OptimizerKind::kSgd, 0.9, false, 0.0, false, 0});
  p.set_grads();
  opt.set_lr(0.1);
  opt.step();
  auto state = opt.state();
  ASSERT_EQ(state.size(), 2u);
  EXPECT_TRUE(state.count("momentum_buffer.fc.weight"));
  Params q;
  Optimizer restored(q.named(), {OptimizerKind::kSgd, 0.9, false, 0.0, false, 0});
  restored.load_state(state);
  EXPECT_TRUE(torch::equal(restored.state().at("momentum_buffer.fc.bias"),
                           state.at("momentum_buffer.fc.bias")));
}

LossScalerOptions fp16_scaler(int64_t growth_interval) {
  LossScalerOptions o;
  o.enabled = true;
  o.init_scale = 1024;
  o.growth_interval = growth_interval;
  return o;
}

TEST(LossScaler, UnscalesGradientsAndScalesTheLoss) {
  LossScaler scaler(fp16_scaler(100), torch::kCPU);
  EXPECT_EQ(scaler.scale(torch::tensor(2.0f)).item<float>(), 2048.0f);
  std::vector<torch::Tensor> grads = {torch::full({3}, 2048.0f)};
  scaler.unscale_(grads);
  EXPECT_TRUE(grads[0].eq(2.0f).all().item<bool>());
  EXPECT_EQ(scaler.found_inf()->item<float>(), 0.0f);
}

TEST(LossScaler, InfGradientSkipsTheStepAndHalvesTheScale) {
  LossScaler scaler(fp16_scaler(100), torch::kCPU);
  Params p;
  Optimizer opt(p.named(), {OptimizerKind::kSgd, 0.9, false, 0.0, false, 0});
  const auto w0 = p.weight.detach().clone();
  p.set_grads();
  p.bias.mutable_grad()[1] = std::numeric_limits<float>::quiet_NaN();
  scaler.unscale_(opt.grads());
  EXPECT_EQ(scaler.found_inf()->item<float>(), 1.0f);
  opt.set_lr(0.1);
  opt.step(scaler.found_inf());
  scaler.update();
  EXPECT_TRUE(torch::equal(p.weight, w0));
  EXPECT_EQ(scaler.scale_value(), 512.0);
  EXPECT_EQ(scaler.found_inf()->item<float>(), 0.0f);  // reset for the next step
}

TEST(LossScaler, GrowsAfterGrowthIntervalCleanSteps) {
  LossScaler scaler(fp16_scaler(3), torch::kCPU);
  std::vector<torch::Tensor> grads = {torch::ones({2})};
  for (int i = 0; i < 2; ++i) {
    scaler.unscale_(grads);
    scaler.update();
  }
  EXPECT_EQ(scaler.scale_value(), 1024.0);
  scaler.unscale_(grads);
  scaler.update();
  EXPECT_EQ(scaler.scale_value(), 2048.0);
  EXPECT_EQ(scaler.growth_tracker_value(), 0);
}

TEST(LossScaler, DisabledIsTheIdentity) {
  LossScaler scaler(LossScalerOptions{}, torch::kCPU);
  EXPECT_FALSE(scaler.found_inf().has_value());
  EXPECT_EQ(scaler.scale(torch::tensor(3.0f)).item<float>(), 3.0f);
}

}  // namespace
}  // namespace trainer
