// The stem's 7x7, stride-2 convolution (padding 3) in the forms that give the same outputs but
// run on different cuDNN kernels. The weight is always torchvision's conv1.weight (64, 3, 7, 7):
// each form rearranges it inside autograd, so its gradient arrives in that shape.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace trainer {

constexpr int64_t kStemKernel = 7, kStemStride = 2, kStemPadding = 3;

// The image with zero channels up to `channels` (3, 4 or 8), and the weight with zero input
// channels to match: cuDNN's NHWC kernels want channel counts divisible by 4 or 8.
at::Tensor padded_stem_conv(const at::Tensor& image, const at::Tensor& weight, int64_t channels);

// The convolution over 2x2 blocks of pixels (space-to-depth, as TPU and MLPerf ResNet-50s run
// their stem): output pixel o reads padded input pixels 2o .. 2o+6, which are blocks o .. o+3, so
// the 7x7/2 convolution of 3 channels is a 4x4/1 convolution of the blocks' 4x3 values. A zero
// fourth channel makes that 16 channels (a multiple of 8); the weight is padded to 8x8 with zeros
// and rearranged the same way. On Hopper cuDNN ran the 7x7/2 form on older-generation kernels
// (sm80 implicit GEMM, ~15x the arithmetic's time; docs/BENCHMARKS.md); 16 channels at stride 1
// is the shape the newer kernels take, which a GPU run must confirm (scripts/device/checks.sh
// stem). Any image size; the outputs are the plain convolution's up to the order of the additions.
at::Tensor space_to_depth_stem_conv(const at::Tensor& image, const at::Tensor& weight);

}  // namespace trainer
