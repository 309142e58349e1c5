// Steps of one bottleneck for the tests of its GPU variants (test_conv_bn_fusion.cpp,
// test_residual_gradient.cpp): a block with random BN state, its state copied to another, a step's
// output and every gradient and buffer, a variant's accuracy on the GPU against the plain block's,
// and ResNet-50's bottleneck shapes.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "models/conv_bn_fusion.h"
#include "models/resnet.h"
#include "src/train/autocast.h"

namespace trainer::block_steps {

// ||out - ref|| / ||ref||, in float64 on the CPU.
inline double relative_error(const torch::Tensor& out, const torch::Tensor& ref) {
  const torch::Tensor o = out.detach().cpu().to(torch::kDouble);
  const torch::Tensor r = ref.detach().cpu().to(torch::kDouble);
  return ((o - r).norm() / r.norm()).item<double>();
}

// The blocks' options in these tests: cuDNN's fused batch norm, and `variant`'s other switches.
inline ResNetOptions block_options(ResNetOptions variant = {}) {
  variant.fused_batch_norm = true;
  return variant;
}

// A bottleneck with random BN parameters and running statistics (never the defaults).
inline Bottleneck random_bottleneck(int64_t in_channels, int64_t width, int64_t stride,
                                    const ResNetOptions& options = block_options()) {
  Bottleneck block(in_channels, width, stride, options);
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
inline void copy_state(Bottleneck& from, Bottleneck& to) {
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

inline StepResult step(Bottleneck& block, const torch::Tensor& x, const torch::Tensor& dy,
                       std::optional<ConvBnBackend> fused_backend = std::nullopt) {
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

// One block's step in fp16 and bf16 autocast on the GPU, built with `variant`'s options and with
// the plain ones (cuDNN's fused BN), each against the same block and inputs in float64 on the CPU:
// the variant no further off than the plain block (1.5x its error, or a rounding floor of the
// type), for the output, the input's gradient, every parameter's gradient and the running
// statistics. ResNet-50's layer2 shapes at 28 px: its first (strided, downsample) block and an
// identity one.
inline void expect_as_accurate_as_the_plain_block(const ResNetOptions& variant) {
  const torch::Device gpu(torch::kCUDA, 0);
  const auto channels_last = c10::MemoryFormat::ChannelsLast;
  struct Shape {
    int64_t in, width, stride, side;
  };
  for (const Shape shape : {Shape{256, 128, 2, 56}, Shape{512, 128, 1, 28}}) {
    torch::manual_seed(19);
    Bottleneck reference = random_bottleneck(shape.in, shape.width, shape.stride);
    reference->to(torch::kDouble);
    const torch::Tensor x64 = torch::randn({16, shape.in, shape.side, shape.side},
                                           torch::kDouble)
                                  .relu();  // a block's input: post-ReLU
    const int64_t out_side = (shape.side - 1) / shape.stride + 1;
    const torch::Tensor dy64 =
        torch::randn({16, shape.width * 4, out_side, out_side}, torch::kDouble);
    const StepResult want = step(reference, x64, dy64);
    for (const at::ScalarType dtype : {at::kHalf, at::kBFloat16}) {
      // The reference's weights and statistics in a float32 block on the GPU, run through forward.
      auto run = [&](const ResNetOptions& options) {
        Bottleneck block(shape.in, shape.width, shape.stride, options);
        block->to(gpu);
        for (auto& p : block->parameters())
          if (p.dim() == 4) p.set_data(p.data().contiguous(channels_last));
        copy_state(reference, block);
        AutocastGuard autocast(torch::kCUDA, dtype);
        return step(block, x64.to(gpu, dtype).contiguous(channels_last),
                    dy64.to(gpu, dtype).contiguous(channels_last));
      };
      const StepResult fused = run(block_options(variant)), plain = run(block_options());
      const bool half = dtype == at::kHalf;
      const double floor = half ? 2e-3 : 1.5e-2;
      auto expect_close = [&](const torch::Tensor& f, const torch::Tensor& p,
                              const torch::Tensor& w, const std::string& what) {
        const double fe = relative_error(f, w), pe = relative_error(p, w);
        std::cout << c10::toString(dtype) << " stride " << shape.stride << " " << what
                  << " relative error, variant / plain: " << fe << " / " << pe << "\n";
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
inline void for_each_resnet50_bottleneck(
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

}  // namespace trainer::block_steps
