// The residual block's input gradient summed inside its first convolution's dgrad
// (models/residual_gradient.h). On the CPU: the op's two outputs and their gradients, in ATen's
// ops and float64, against autograd's sum of the two branches; the model's CPU path untouched. On
// the GPU: cuDNN builds the dgrad-add graph of every ResNet-50 block, and a block with it is as
// accurate as without, in fp16 and bf16. The GPU tests skip, with the reason, without a GPU.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <functional>
#include <iostream>
#include <string>

#include "models/cuda/conv_bn_graphs.h"
#include "models/residual_gradient.h"
#include "models/resnet.h"
#include "tests/support/bottleneck_steps.h"

namespace trainer {
namespace {

using block_steps::relative_error;

struct Gradients {
  torch::Tensor y, dx, dw, dw_shortcut;
};

// A step through a block's first convolution (of `stride`, its kernel 1x1 at stride 1 and 3x3 at
// 2, as ResNet's blocks) and a shortcut reading the same input (the identity at stride 1, a
// strided 1x1 convolution at 2), with a non-linear loss; conv_beside_shortcut's when `op`, else
// autograd's two branches.
Gradients first_convolution_step(int64_t stride, bool op, bool use_y, bool use_shortcut) {
  torch::manual_seed(29);
  const auto f64 = torch::kDouble;
  const torch::Tensor x = torch::randn({3, 8, 9, 9}, f64).requires_grad_();
  const torch::Tensor w =
      torch::randn({6, 8, stride == 1 ? 1 : 3, stride == 1 ? 1 : 3}, f64).requires_grad_();
  const torch::Tensor w_shortcut = torch::randn({6, 8, 1, 1}, f64).requires_grad_();
  const int64_t side = (9 - 1) / stride + 1;
  const torch::Tensor ry = torch::randn({3, 6, side, side}, f64);
  const torch::Tensor rs = torch::randn({3, stride == 1 ? 8 : 6, side, side}, f64);
  torch::Tensor y, input = x;
  if (op) {
    const ConvBesideShortcut out = conv_beside_shortcut(x, w, stride, ConvBnBackend::kAten);
    EXPECT_EQ(out.shortcut.data_ptr(), x.data_ptr()) << "the shortcut reads x itself, no copy";
    y = out.y, input = out.shortcut;
  } else {
    y = torch::conv2d(x, w, {}, stride, w.size(2) / 2);
  }
  const torch::Tensor shortcut =
      stride == 1 ? input : torch::conv2d(input, w_shortcut, torch::Tensor(), stride);
  torch::Tensor loss = torch::zeros({}, f64);
  if (use_y) loss = loss + (y * ry).sum();
  if (use_shortcut) loss = loss + (shortcut.tanh() * rs).sum();
  loss.backward();
  return {y.detach(), x.grad(), w.grad(), w_shortcut.grad()};
}

// Each gradient equal to autograd's to rounding, whichever branches the loss reads.
TEST(ResidualGradient, SumsTheConvolutionsAndTheShortcutsGradients) {
  for (const int64_t stride : {1, 2}) {
    for (const auto& [use_y, use_shortcut] :
         {std::pair{true, true}, {true, false}, {false, true}}) {
      const std::string where = "stride " + std::to_string(stride) + (use_y ? ", y" : "") +
                                (use_shortcut ? ", shortcut" : "");
      const Gradients want = first_convolution_step(stride, false, use_y, use_shortcut);
      const Gradients got = first_convolution_step(stride, true, use_y, use_shortcut);
      EXPECT_TRUE(torch::equal(got.y, want.y)) << where;
      ASSERT_TRUE(got.dx.defined()) << where;
      EXPECT_LT(relative_error(got.dx, want.dx), 1e-12) << where;
      if (use_y) {
        EXPECT_LT(relative_error(got.dw, want.dw), 1e-12) << where;
      } else {
        EXPECT_FALSE(got.dw.defined() && got.dw.abs().max().item<double>() > 0) << where;
      }
      if (stride > 1 && use_shortcut)
        EXPECT_LT(relative_error(got.dw_shortcut, want.dw_shortcut), 1e-12) << where;
    }
  }
}

// The key changes nothing on the CPU: the plain path runs, bit for bit.
TEST(ResidualGradient, OnTheCpuTheModelRunsThePlainPath) {
  torch::manual_seed(31);
  ResNetOptions keyed_options;
  keyed_options.fused_residual_gradient = true;
  Bottleneck plain = block_steps::random_bottleneck(32, 8, 2);
  Bottleneck keyed(32, 8, 2, block_steps::block_options(keyed_options));
  block_steps::copy_state(plain, keyed);
  const torch::Tensor x = torch::randn({2, 32, 8, 8}), dy = torch::randn({2, 32, 4, 4});
  const block_steps::StepResult want = block_steps::step(plain, x, dy);
  const block_steps::StepResult got = block_steps::step(keyed, x, dy);
  EXPECT_TRUE(torch::equal(got.y, want.y));
  EXPECT_TRUE(torch::equal(got.dx, want.dx));
  for (size_t i = 0; i < want.grads.size(); ++i)
    EXPECT_TRUE(torch::equal(got.grads[i], want.grads[i])) << "grad " << i;
}

// Calls check(dy, w1, x, where) for the first convolution of each kind of ResNet-50 bottleneck
// (tests/support/bottleneck_steps.h): conv1, 1x1 at stride 1, and its input x.
void for_each_first_convolution(
    const std::function<void(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                             const std::string&)>& check) {
  block_steps::for_each_resnet50_bottleneck([&](const torch::Tensor& x, const torch::Tensor& w1,
                                                const torch::Tensor&, const torch::Tensor&, int64_t,
                                                const std::string& where) {
    check(torch::empty({x.size(0), w1.size(0), x.size(2), x.size(3)}, x.options()), w1, x, where);
  });
}

// The graph asked of cuDNN is well formed for every ResNet-50 block (cudnn-frontend's host-side
// validation, no GPU needed); whether this GPU has an engine for it is the GPU test below.
TEST(ResidualGradient, CudnnGraphOfEveryResNet50BlockIsWellFormed) {
  for_each_first_convolution([](const torch::Tensor& dy, const torch::Tensor& w1,
                                const torch::Tensor& x, const std::string& where) {
    EXPECT_EQ(conv_bn_graphs::validate_dgrad_add(dy, w1, x, 1), "") << where;
  });
}

class ResidualGradientGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible to this process";
  }
};

// cuDNN builds the dgrad-add graph of every ResNet-50 block's first convolution, in fp16 and
// bf16: otherwise the key would leave those blocks to ATen's dgrad and add.
TEST_F(ResidualGradientGpu, CudnnBuildsTheDgradAddOfEveryResNet50Block) {
  for_each_first_convolution([](const torch::Tensor& dy, const torch::Tensor& w1,
                                const torch::Tensor& x, const std::string& where) {
    EXPECT_EQ(conv_bn_graphs::prepare_dgrad_add(dy, w1, x, 1), "") << where;
    std::cout << where << ": " << conv_bn_graphs::dgrad_add_engine(dy, w1, x, 1) << "\n";
  });
}

// A block with the key in fp16 and bf16 as accurate as without (tests/support/bottleneck_steps.h).
TEST_F(ResidualGradientGpu, BottleneckIsAsAccurateAsThePlainOne) {
  ResNetOptions residual_fused;
  residual_fused.fused_residual_gradient = true;
  block_steps::expect_as_accurate_as_the_plain_block(residual_fused);
}

}  // namespace
}  // namespace trainer
