// max_pool2d on the GPU over channels_last activations, keeping a byte per output for its
// backward instead of ATen's int64 index (models/cuda/max_pool_kernel.h): ATen's values and
// gradients bit for bit, with an eighth of the index traffic. The `compact_max_pool` key puts it
// in the model's stem.
#pragma once

#include <ATen/core/Tensor.h>

namespace trainer {

// Whether compact_max_pool2d takes x: a 4-D channels_last float, half or bfloat16 CUDA tensor.
// Anything else keeps ATen's max_pool2d.
bool compact_max_pool_applies(const at::Tensor& x);

// max_pool2d(x, kernel, stride, padding) (dilation 1, ceil_mode false), differentiable, where
// compact_max_pool_applies(x); channels_last output and input gradient. An activation of over
// 2^30 values (the kernels index in 32 bits) gets ATen's max_pool2d.
at::Tensor compact_max_pool2d(const at::Tensor& x, int kernel, int stride, int padding);

}  // namespace trainer
