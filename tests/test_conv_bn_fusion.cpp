// The convolution-side batch norm fusion (models/conv_bn_fusion.h). On the CPU: its arithmetic, in
// ATen's ops and float64, against the plain bottleneck: outputs, every gradient, running
// statistics, over two steps; and the model's CPU path untouched. On the GPU: cuDNN's graphs in
// fp16 and bf16 against float64, no further off than the plain path in the same dtype, a block
// at a time and the whole ResNet-50's step. The GPU tests skip, with the reason, without a GPU.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "models/conv_bn_fusion.h"
#include "models/cuda/conv_bn_graphs.h"
#include "models/resnet.h"
#include "src/train/autocast.h"

namespace trainer {
namespace {

// ||out - ref|| / ||ref||, in float64 on the CPU.
double relative_error(const torch::Tensor& out, const torch::Tensor& ref) {
  const torch::Tensor o = out.detach().cpu().to(torch::kDouble);
  const torch::Tensor r = ref.detach().cpu().to(torch::kDouble);
  return ((o - r).norm() / r.norm()).item<double>();
}

// A bottleneck with random BN parameters and running statistics (never the defaults).
Bottleneck random_bottleneck(int64_t in_channels, int64_t width, int64_t stride, bool conv_fused) {
  Bottleneck block(in_channels, width, stride, /*blurpool=*/false, /*fused_batch_norm=*/true,
                   conv_fused);
  torch::NoGradGuard no_grad;
  for (auto& module : block->modules(/*include_self=*/false)) {
    if (auto* bn = module->as<torch::nn::BatchNorm2d>()) {
      bn->weight.uniform_(0.5, 1.5);
      bn->bias.normal_(0, 0.2);
      bn->running_mean.normal_(0, 0.2);
      bn->running_var.uniform_(0.5, 1.5);
    }
  }
  return block;
}

// `to` takes `from`'s parameters and buffers (the same architecture), in its own dtype, device and
// layout.
void copy_state(Bottleneck& from, Bottleneck& to) {
  torch::NoGradGuard no_grad;
  const auto from_params = from->parameters(), to_params = to->parameters();
  for (size_t i = 0; i < to_params.size(); ++i) to_params[i].copy_(from_params[i]);
  const auto from_buffers = from->buffers(), to_buffers = to->buffers();
  for (size_t i = 0; i < to_buffers.size(); ++i) to_buffers[i].copy_(from_buffers[i]);
}

// Everything a step of `block` changes or makes: its output, the input's gradient, every
// parameter's gradient and every buffer (running statistics, batch counts), flattened in order.
struct StepResult {
  torch::Tensor y, dx;
  std::vector<torch::Tensor> grads, buffers;
};

StepResult step(Bottleneck& block, const torch::Tensor& x, const torch::Tensor& dy,
                std::optional<ConvBnBackend> fused_backend) {
  block->zero_grad();
  torch::Tensor input = x.detach().clone().requires_grad_();
  torch::Tensor y =
      fused_backend ? block->forward_conv_bn_fused(input, *fused_backend) : block->forward(input);
  y.backward(dy);
  StepResult r{y.detach(), input.grad(), {}, {}};
  for (const auto& p : block->parameters()) r.grads.push_back(p.grad().clone());
  for (const auto& b : block->buffers()) r.buffers.push_back(b.clone());
  return r;
}

// Two steps of the fused arithmetic in ATen's ops against the plain block, in float64: equal to
// rounding. A strided block with a downsample shortcut and an identity one.
TEST(ConvBnFusion, AtenArithmeticMatchesThePlainBottleneckOverTwoSteps) {
  torch::manual_seed(13);
  struct Shape {
    int64_t in, width, stride;
  };
  for (const Shape shape : {Shape{32, 16, 2}, Shape{64, 16, 1}}) {
    Bottleneck plain = random_bottleneck(shape.in, shape.width, shape.stride, false);
    plain->to(torch::kDouble);
    Bottleneck fused(shape.in, shape.width, shape.stride, false, true, false);
    fused->to(torch::kDouble);
    copy_state(plain, fused);
    for (int s = 0; s < 2; ++s) {
      // Conv-input-like activations: off-centre, unit-ish spread.
      const torch::Tensor x = torch::randn({4, shape.in, 10, 10}, torch::kDouble) + 0.3;
      const int64_t side = (10 - 1) / shape.stride + 1;
      const torch::Tensor dy = torch::randn({4, shape.width * 4, side, side}, torch::kDouble);
      const StepResult want = step(plain, x, dy, std::nullopt);
      const StepResult got = step(fused, x, dy, ConvBnBackend::kAten);
      const std::string where =
          "stride " + std::to_string(shape.stride) + ", step " + std::to_string(s + 1);
      EXPECT_LT(relative_error(got.y, want.y), 1e-12) << where;
      EXPECT_LT(relative_error(got.dx, want.dx), 1e-10) << where;
      ASSERT_EQ(got.grads.size(), want.grads.size());
      for (size_t i = 0; i < got.grads.size(); ++i)
        EXPECT_LT(relative_error(got.grads[i], want.grads[i]), 1e-10) << where << ", grad " << i;
      ASSERT_EQ(got.buffers.size(), want.buffers.size());
      for (size_t i = 0; i < got.buffers.size(); ++i)
        EXPECT_LT(relative_error(got.buffers[i], want.buffers[i]), 1e-12)
            << where << ", buffer " << i;
    }
  }
}

// The key changes nothing on the CPU: the plain path runs, bit for bit.
TEST(ConvBnFusion, OnTheCpuTheModelRunsThePlainPath) {
  torch::manual_seed(17);
  Bottleneck plain = random_bottleneck(32, 8, 2, false);
  Bottleneck keyed(32, 8, 2, false, true, /*fused_conv_batch_norm=*/true);
  copy_state(plain, keyed);
  const torch::Tensor x = torch::randn({2, 32, 8, 8});
  EXPECT_TRUE(torch::equal(keyed->forward(x), plain->forward(x)));
  const auto keyed_buffers = keyed->buffers(), plain_buffers = plain->buffers();
  for (size_t i = 0; i < plain_buffers.size(); ++i)
    EXPECT_TRUE(torch::equal(keyed_buffers[i], plain_buffers[i])) << "buffer " << i;
}

class ConvBnFusionGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible to this process";
  }
};

// One block's step in fp16 and bf16 autocast on the GPU, cuDNN's graphs and the plain path (with
// cuDNN's fused BN), each against the same block and inputs in float64 on the CPU: the graphs no
// further off than the plain path (1.5x its error, or a rounding floor of the type), for the
// output, the input's gradient, every parameter's gradient and the running statistics. ResNet-50's
// layer2 shapes at 28 px: its first (strided, downsample) block and an identity one.
TEST_F(ConvBnFusionGpu, BottleneckIsAsAccurateAsThePlainOne) {
  const torch::Device gpu(torch::kCUDA, 0);
  const auto channels_last = c10::MemoryFormat::ChannelsLast;
  struct Shape {
    int64_t in, width, stride, side;
  };
  for (const Shape shape : {Shape{256, 128, 2, 56}, Shape{512, 128, 1, 28}}) {
    torch::manual_seed(19);
    Bottleneck reference = random_bottleneck(shape.in, shape.width, shape.stride, false);
    reference->to(torch::kDouble);
    const torch::Tensor x64 = torch::randn({16, shape.in, shape.side, shape.side},
                                           torch::kDouble)
                                  .relu();  // a block's input: post-ReLU
    const int64_t out_side = (shape.side - 1) / shape.stride + 1;
    const torch::Tensor dy64 =
        torch::randn({16, shape.width * 4, out_side, out_side}, torch::kDouble);
    const StepResult want = step(reference, x64, dy64, std::nullopt);
    for (const at::ScalarType dtype : {at::kHalf, at::kBFloat16}) {
      // The reference's weights and statistics in a float32 block on the GPU, run through forward.
      auto run = [&](bool conv_fused) {
        Bottleneck block(shape.in, shape.width, shape.stride, false, true, conv_fused);
        block->to(gpu);
        for (auto& p : block->parameters())
          if (p.dim() == 4) p.set_data(p.data().contiguous(channels_last));
        copy_state(reference, block);
        AutocastGuard autocast(torch::kCUDA, dtype);
        return step(block, x64.to(gpu, dtype).contiguous(channels_last),
                    dy64.to(gpu, dtype).contiguous(channels_last), std::nullopt);
      };
      const StepResult fused = run(true), plain = run(false);
      const bool half = dtype == at::kHalf;
      const double floor = half ? 2e-3 : 1.5e-2;
      auto expect_close = [&](const torch::Tensor& f, const torch::Tensor& p,
                              const torch::Tensor& w, const std::string& what) {
        const double fe = relative_error(f, w), pe = relative_error(p, w);
        std::cout << c10::toString(dtype) << " stride " << shape.stride << " " << what
                  << " relative error, fused / plain: " << fe << " / " << pe << "\n";
        EXPECT_LT(fe, std::max(1.5 * pe, floor)) << c10::toString(dtype) << " " << what;
      };
      expect_close(fused.y, plain.y, want.y, "y");
      expect_close(fused.dx, plain.dx, want.dx, "dx");
      for (size_t i = 0; i < want.grads.size(); ++i)
        expect_close(fused.grads[i], plain.grads[i], want.grads[i], "grad " + std::to_string(i));
      for (size_t i = 0; i < want.buffers.size(); ++i)
        expect_close(fused.buffers[i], plain.buffers[i], want.buffers[i],
                     "buffer " + std::to_string(i));
    }
  }
}

// Calls check(x, w1, w2, w3, stride, where) for each kind of ResNet-50 bottleneck at 224 px and
// batch 256 (each stage's first block and one after it), in fp16 and bf16: meta tensors, as only
// the shapes are read.
void for_each_resnet50_bottleneck(
    const std::function<void(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                             const torch::Tensor&, int64_t, const std::string&)>& check) {
  const auto meta = torch::TensorOptions().device(torch::kMeta);
  for (const at::ScalarType dtype : {at::kHalf, at::kBFloat16}) {
    int64_t in = 64, side = 56;
    const int64_t widths[] = {64, 128, 256, 512};
    for (int stage = 0; stage < 4; ++stage) {
      const int64_t width = widths[stage];
      for (const int64_t stride : {stage == 0 ? int64_t{1} : int64_t{2}, int64_t{1}}) {
        auto w = [&](int64_t k, int64_t c, int64_t r) {
          return torch::empty({k, c, r, r}, meta.dtype(dtype));
        };
        check(torch::empty({256, in, side, side}, meta.dtype(dtype)), w(width, in, 1),
              w(width, width, 3), w(width * 4, width, 1), stride,
              std::string(c10::toString(dtype)) + " layer" + std::to_string(stage + 1) +
                  " stride " + std::to_string(stride));
        if (stride > 1) side /= 2;
        in = width * 4;
      }
    }
  }
}

// What the fusion asks cuDNN for is well formed for every ResNet-50 bottleneck: each graph's
// attributes complete and consistent, its shapes inferred (cudnn-frontend's host-side
// validation, no GPU needed). Whether this GPU has engines for them is the test below.
TEST(ConvBnFusion, CudnnGraphsOfEveryResNet50BottleneckAreWellFormed) {
  for_each_resnet50_bottleneck([](const torch::Tensor& x, const torch::Tensor& w1,
                                  const torch::Tensor& w2, const torch::Tensor& w3, int64_t stride,
                                  const std::string& where) {
    const int64_t side = (x.size(2) - 1) / stride + 1;
    const torch::Tensor y1 =
        torch::empty({x.size(0), w1.size(0), x.size(2), x.size(3)}, x.options());
    const torch::Tensor y2 = torch::empty({x.size(0), w2.size(0), side, side}, x.options());
    EXPECT_EQ(conv_bn_graphs::validate(x, w1, 1, /*through_bn=*/false, true), "") << where;
    EXPECT_EQ(conv_bn_graphs::validate(y1, w2, stride, true, true), "") << where;
    EXPECT_EQ(conv_bn_graphs::validate(y2, w3, 1, true, /*with_stats=*/false), "") << where;
  });
}

// cuDNN builds the graphs of ResNet-50's bottlenecks on this GPU, in fp16 and bf16: otherwise
// the key would leave those blocks unfused (and say so), and the speed would not come.
TEST_F(ConvBnFusionGpu, CudnnBuildsEveryResNet50Bottleneck) {
  for_each_resnet50_bottleneck([](const torch::Tensor& x, const torch::Tensor& w1,
                                  const torch::Tensor& w2, const torch::Tensor& w3, int64_t stride,
                                  const std::string& where) {
    EXPECT_EQ(cudnn_bottleneck_failure(x, w1, w2, w3, stride), "") << where;
    // conv1's statistics from its epilogue too, or a pass of their own: said, not required.
    const std::string conv1 = conv_bn_graphs::prepare(x, w1, 1, /*through_bn=*/false, true);
    std::cout << where << ": conv1 " << (conv1.empty() ? "conv-genstats" : "unfused: " + conv1)
              << "\n";
  });
}

}  // namespace
}  // namespace trainer
