// A residual block's input x is read by two branches: the block's first convolution and its
// shortcut (the identity, or the downsample's convolution). Autograd sums x's two gradients in a
// pass of its own, reading both and writing the sum (its share of the step: docs/BENCHMARKS.md).
// conv_beside_shortcut returns the convolution's output and x again, for the shortcut to read,
// as one differentiable op: its backward receives both gradients and sums them inside the
// convolution's dgrad, in the epilogue of one cuDNN graph (models/cuda/conv_bn_graphs.h), or as
// ATen's dgrad and an add where cuDNN has no such graph and off the GPU.
#pragma once

#include <ATen/core/Tensor.h>

#include "models/conv_bn_fusion.h"

namespace trainer {

struct ConvBesideShortcut {
  at::Tensor y;         // conv(x, w) at `stride`, "same" padding, no bias
  at::Tensor shortcut;  // x, for the shortcut branch to read
};

// kCudnn sums the gradients in cuDNN's dgrad where it has the graph for these shapes (asked once
// per shape; channels_last fp16 or bf16 on the GPU), kAten always with ATen's ops. w in x's dtype.
ConvBesideShortcut conv_beside_shortcut(const at::Tensor& x, const at::Tensor& w, int64_t stride,
                                        ConvBnBackend backend);

// Whether the GPU path applies to an activation: channels_last fp16 or bf16 on the GPU.
bool residual_gradient_fusable(const at::Tensor& x);

}  // namespace trainer
