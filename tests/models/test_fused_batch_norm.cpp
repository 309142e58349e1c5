// The fused batch norm (models/cuda/fused_batch_norm.h): on the GPU, each fused op against float64
// on random inputs, forward, running statistics and every gradient, in fp16 and bf16; the whole
// ResNet's logits and gradients, fused and unfused, against float32. On the CPU, the same ops as
// the unfused model, bit for bit. The GPU tests skip, with the reason, without a GPU.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <iostream>
#include <optional>
#include <string>
#include <utility>

#include "models/cuda/fused_batch_norm.h"
#include "models/resnet.h"
#include "src/train/autocast.h"
#include "tests/support/bottleneck_steps.h"

namespace trainer {
namespace {

namespace nn = torch::nn;
using block_steps::relative_error;

// A BN of `channels` with random affine parameters and running statistics (never the defaults).
nn::BatchNorm2d random_batch_norm(int64_t channels) {
  nn::BatchNorm2d bn(channels);
  torch::NoGradGuard no_grad;
  bn->weight.uniform_(0.5, 1.5);
  bn->bias.normal_(0, 0.2);
  bn->running_mean.normal_(0, 0.2);
  bn->running_var.uniform_(0.5, 1.5);
  return bn;
}

// The op under test applied to copies: `dtype` on `device` with `fused`, against the same BN's
// state and inputs in float64 on the CPU through ATen's ops.
struct OpErrors {
  double y, dx, dresidual, dweight, dbias, running_mean, running_var;
};

OpErrors op_errors(torch::Dtype dtype, bool relu, bool with_residual, const torch::Device& device,
                   bool fused) {
  const auto channels_last = c10::MemoryFormat::ChannelsLast;
  const int64_t c = 64;
  nn::BatchNorm2d reference = random_batch_norm(c);
  reference->to(torch::kDouble);
  nn::BatchNorm2d tested = std::dynamic_pointer_cast<nn::BatchNorm2dImpl>(reference->clone());
  tested->to(device, torch::kFloat);
  // Conv-output-like activations: off-centre, unit-ish spread; a residual of the same shape.
  const torch::Tensor x64 = torch::randn({8, c, 14, 14}, torch::kDouble) * 2 + 0.5;
  const torch::Tensor r64 = with_residual ? torch::randn_like(x64) : torch::Tensor();
  const torch::Tensor dy64 = torch::randn_like(x64);

  torch::Tensor x = x64.to(device, dtype).contiguous(channels_last).requires_grad_();
  torch::Tensor r = with_residual ? r64.to(device, dtype).contiguous(channels_last).requires_grad_()
                                  : torch::Tensor();
  torch::Tensor y = batch_norm_act(*tested, x, r, relu, fused);
  y.backward(dy64.to(device, dtype).contiguous(channels_last));

  torch::Tensor xr = x64.clone().requires_grad_();
  torch::Tensor rr = with_residual ? r64.clone().requires_grad_() : torch::Tensor();
  torch::Tensor yr = batch_norm_act(*reference, xr, rr, relu, /*fused=*/false);
  yr.backward(dy64);

  EXPECT_EQ(y.scalar_type(), dtype);
  EXPECT_TRUE(y.is_contiguous(channels_last));
  EXPECT_EQ(tested->num_batches_tracked.item<int64_t>(), 1);
  return {relative_error(y, yr),
          relative_error(x.grad(), xr.grad()),
          with_residual ? relative_error(r.grad(), rr.grad()) : 0.0,
          relative_error(tested->weight.grad(), reference->weight.grad()),
          relative_error(tested->bias.grad(), reference->bias.grad()),
          relative_error(tested->running_mean, reference->running_mean),
          relative_error(tested->running_var, reference->running_var)};
}

class FusedBatchNormGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible to this process";
  }
};

// Each op (BN, BN+ReLU, BN+add+ReLU) in fp16 and bf16 against float64, beside ATen's unfused ops
// in the same dtype. The output: about one rounding of its type (fp16 2^-11, bf16 2^-8). The
// gradients start from an upstream gradient and inputs rounded to that type, and a ReLU's mask
// flips where rounding moves a value across zero, so ATen's own gradients are 1-4% off (H200,
// 2026-11-26): the fused ones within 1.5x ATen's error or a rounding floor, and under an absolute
// bound. The fp32 running statistics: far tighter.
TEST_F(FusedBatchNormGpu, EachOpMatchesFloat64ForwardStatisticsAndGradients) {
  torch::manual_seed(7);
  const torch::Device gpu(torch::kCUDA, 0);
  for (const torch::Dtype dtype : {torch::kHalf, torch::kBFloat16}) {
    const std::string path = fused_batch_norm_path(dtype, 0);
    std::cout << c10::toString(dtype) << ": " << path << "\n";
    if (dtype == torch::kHalf) EXPECT_EQ(path, "cuDNN BN+ReLU and BN+add+ReLU");
    const bool half = dtype == torch::kHalf;
    const double y_bound = half ? 1e-3 : 8e-3, floor = half ? 2e-3 : 1.5e-2,
                 gradient_bound = half ? 2e-2 : 6e-2;
    for (const auto& [relu, residual] : {std::pair{false, false}, {true, false}, {true, true}}) {
      const OpErrors fused = op_errors(dtype, relu, residual, gpu, /*fused=*/true);
      const OpErrors aten = op_errors(dtype, relu, residual, gpu, /*fused=*/false);
      const std::string op = !relu ? "BN" : residual ? "BN+add+ReLU" : "BN+ReLU";
      std::cout << c10::toString(dtype) << " " << op << " relative error, fused / ATen: y "
                << fused.y << " / " << aten.y << ", dx " << fused.dx << " / " << aten.dx
                << ", dresidual " << fused.dresidual << " / " << aten.dresidual << ", dweight "
                << fused.dweight << " / " << aten.dweight << ", dbias " << fused.dbias << " / "
                << aten.dbias << ", running mean " << fused.running_mean << " / "
                << aten.running_mean << ", running var " << fused.running_var << " / "
                << aten.running_var << "\n";
      const std::string what = std::string(c10::toString(dtype)) + " " + op;
      EXPECT_LT(fused.y, y_bound) << what;
      const std::pair<double, double> gradients[] = {{fused.dx, aten.dx},
                                                     {fused.dresidual, aten.dresidual},
                                                     {fused.dweight, aten.dweight},
                                                     {fused.dbias, aten.dbias}};
      for (const auto& [fused_error, aten_error] : gradients) {
        EXPECT_LT(fused_error, std::max(1.5 * aten_error, floor)) << what;
        EXPECT_LT(fused_error, gradient_bound) << what;
      }
      EXPECT_LT(fused.running_mean, 5e-4) << what;
      EXPECT_LT(fused.running_var, 5e-4) << what;
    }
  }
}

// One training step's logits and gradients of a whole ResNet in fp16 and bf16 autocast, fused (the
// batch norm alone, and with the convolution-side fusion, models/conv_bn_fusion.h) and unfused,
// against the same weights and images in float32: each fused model is no less accurate than the
// unfused one (at most 1.25x its error, or within a rounding of the output type). 128 px
// images, so that layer4's batch norms see 4x4 maps: at 64 px (2x2) ResNet-50's bf16 logits were
// 38% off float32 fused and unfused alike, too far for the comparison to tell anything apart.
TEST_F(FusedBatchNormGpu, ResNetStepIsAsAccurateAsTheUnfusedOne) {
  const torch::Device gpu(torch::kCUDA, 0);
  const auto channels_last = c10::MemoryFormat::ChannelsLast;
  for (const int depth : {18, 50}) {
    torch::manual_seed(11);
    const torch::Tensor images = torch::randn({32, 3, 128, 128}).to(gpu).contiguous(channels_last);
    const torch::Tensor labels = torch::randint(0, 10, {32}).to(gpu);
    // {logits, every parameter's gradient} of one step at `dtype` (nullopt: float32).
    auto step = [&](std::optional<at::ScalarType> dtype, bool fused, bool conv_fused = false) {
      torch::manual_seed(3);  // the same initial weights for every variant
      ResNetOptions options{depth, 10, false, false, WeightInit::kTorchvision, fused};
      options.fused_conv_batch_norm = conv_fused;
      ResNet model(options);
      model->to(gpu);
      for (auto& p : model->parameters())
        if (p.dim() == 4) p.set_data(p.data().contiguous(channels_last));
      torch::Tensor logits;
      {
        AutocastGuard autocast(torch::kCUDA, dtype);
        logits = model->forward(images).to(torch::kFloat);
      }
      torch::nn::functional::cross_entropy(logits, labels).backward();
      std::vector<torch::Tensor> grads;
      for (auto& p : model->parameters()) grads.push_back(p.grad().flatten());
      return std::pair{logits.detach(), torch::cat(grads)};
    };
    const auto [logits, grads] = step(std::nullopt, false);
    for (const at::ScalarType dtype : {at::kHalf, at::kBFloat16}) {
      const auto [unfused_logits, unfused_grads] = step(dtype, false);
      const double unfused[2] = {relative_error(unfused_logits, logits),
                                 relative_error(unfused_grads, grads)};
      for (const bool conv_fused : {false, true}) {
        const auto [fused_logits, fused_grads] = step(dtype, true, conv_fused);
        const double fused[2] = {relative_error(fused_logits, logits),
                                 relative_error(fused_grads, grads)};
        const std::string what = "resnet" + std::to_string(depth) + " " + c10::toString(dtype) +
                                 (conv_fused ? " fused with the convolutions" : " fused");
        std::cout << what << ", relative error against float32, fused / unfused: logits "
                  << fused[0] << " / " << unfused[0] << ", gradients " << fused[1] << " / "
                  << unfused[1] << "\n";
        const double rounding = dtype == at::kHalf ? 1e-3 : 8e-3;
        for (int i = 0; i < 2; ++i)
          EXPECT_LT(fused[i], std::max(1.25 * unfused[i], rounding))
              << what << (i ? " gradients" : " logits");
      }
    }
  }
}

// On the CPU nothing fuses: the ops are ATen's as before, bit for bit, statistics included.
TEST(FusedBatchNorm, OnTheCpuItIsAtensOps) {
  torch::manual_seed(5);
  nn::BatchNorm2d a = random_batch_norm(16);
  nn::BatchNorm2d b = std::dynamic_pointer_cast<nn::BatchNorm2dImpl>(a->clone());
  const torch::Tensor x = torch::randn({4, 16, 6, 6});
  const torch::Tensor r = torch::randn_like(x);
  const torch::Tensor fused = batch_norm_act(*a, x, r, /*relu=*/true, /*fused=*/true);
  torch::Tensor expected = b->forward(x);
  expected += r;
  expected.relu_();
  EXPECT_TRUE(torch::equal(fused, expected));
  EXPECT_TRUE(torch::equal(a->running_mean, b->running_mean));
  EXPECT_TRUE(torch::equal(a->running_var, b->running_var));
  EXPECT_EQ(a->num_batches_tracked.item<int64_t>(), 1);
}

}  // namespace
}  // namespace trainer
