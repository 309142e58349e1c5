// The convolution-side batch norm fusion of NVIDIA's MLPerf ResNet-50, for the bottleneck's two
// BN+ReLUs that a convolution reads (bn1 before conv2, bn2 before conv3). Instead of a BN pass and
// a ReLU over each activation:
//   - the convolution before the BN also writes its output's per-channel sum and sum of squares;
//   - the BN's scale and bias come from those sums (C values, no pass over the activation);
//   - the convolution after applies scale, bias and ReLU as it reads its input.
// Backward, the ReLU's gradient and the BN's weight gradients come out of the dgrad convolution's
// epilogue, the convolution's weight gradient reads the activation recomputed, and the BN's input
// gradient is one element-wise pass. Nothing is stored but the BN's input.
//
// Two implementations of the same steps: cuDNN's fused graphs (models/cuda/conv_bn_graphs.h; the
// GPU, channels_last fp16 or bf16) and ATen's ops, which run anywhere and are what the CPU tests
// check the arithmetic with. The BN's running statistics and batch count change as
// BatchNorm2d::forward changes them, from the same batch mean and unbiased variance.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/batchnorm.h>

#include <string>

namespace trainer {

enum class ConvBnBackend { kAten, kCudnn };

// A convolution's output and the per-channel sum and sum of squares (float32) of it that the
// BN after it reads. The sums carry no gradient: the BN's backward counts their part in x's.
struct ConvOutput {
  at::Tensor y, sum, sq_sum;
};

// y = conv(x, w) at `stride` ("same" padding), with y's sums.
ConvOutput conv_with_stats(const at::Tensor& x, const at::Tensor& w, int64_t stride,
                           ConvBnBackend backend);

// y = conv(relu(bn(x.y)), w): bn in training mode, its batch statistics from x's sums; with_stats
// also gives y's sums (for the BN after y). w in x's dtype; gradients flow to x, w and bn's
// weight and bias.
ConvOutput bn_relu_conv(torch::nn::BatchNorm2dImpl& bn, const ConvOutput& x, const at::Tensor& w,
                        int64_t stride, bool with_stats, ConvBnBackend backend);

// Whether cuDNN has every graph that bn_relu_conv and conv_with_stats need for a bottleneck with
// input x (channels_last fp16 or bf16 on the GPU), convolutions of these weights' shapes (the
// graphs run in x's dtype) and conv2 at `stride`: "" when it has, else which one it lacks and
// why (conv1's graph is not needed: without it conv1's statistics take a pass of their own).
// Builds them on first sight of a shape.
std::string cudnn_bottleneck_failure(const at::Tensor& x, const at::Tensor& w1,
                                     const at::Tensor& w2, const at::Tensor& w3, int64_t stride);

}  // namespace trainer
