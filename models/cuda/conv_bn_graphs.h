// The cuDNN side of the convolution-side batch norm fusion (models/conv_bn_fusion.h): the
// cudnn-frontend graphs of NVIDIA's MLPerf ResNet-50, built once per shape and dtype on first use
// and run on the caller's tensors. All activations and weights are channels_last fp16 or bf16
// on the GPU; per-channel tensors are 1-D float32 unless said otherwise.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace trainer::conv_bn_graphs {

// A convolution's output and its per-channel sum and sum of squares (float32, undefined when not
// asked for): the statistics of the batch norm that reads it.
struct ConvWithStats {
  at::Tensor y, sum, sq_sum;
};

// The gradients of conv(relu(x * scale + bias), w) and of the batch norm that made scale and bias:
// drelu (the ReLU's input gradient, x's dtype), dgamma = sum(drelu x xhat), dbeta = sum(drelu),
// and the convolution's weight gradient.
struct BnReluConvGrads {
  at::Tensor drelu, dgamma, dbeta, dw;
};

// Builds the graphs a convolution of x by w at `stride` needs, forward and backward: plain
// (reading x as it is) or reading it through a BN's scale, bias and ReLU; with or without its
// output's statistics. x and w may be meta tensors. "" when cuDNN built them all on this GPU,
// else which one it could not and cuDNN's reason. Each answer is kept per shape.
std::string prepare(const at::Tensor& x, const at::Tensor& w, int64_t stride, bool through_bn,
                    bool with_stats);

// After prepare(): which engine each of those graphs runs (cuDNN's names), or why none.
std::string engines(const at::Tensor& x, const at::Tensor& w, int64_t stride, bool through_bn,
                    bool with_stats);

// What prepare() asks cuDNN to build, checked on the host only (cudnn-frontend's validate():
// attributes complete and consistent, shapes inferred), with no GPU needed: "" or what is wrong.
std::string validate(const at::Tensor& x, const at::Tensor& w, int64_t stride, bool through_bn,
                     bool with_stats);

// y = conv(x, w) and y's statistics as one graph; only where cuDNN has it (prepare() says).
ConvWithStats conv_stats(const at::Tensor& x, const at::Tensor& w, int64_t stride);

// y = conv(relu(x * scale + bias), w), and y's statistics when with_stats; scale and bias in
// x's dtype.
ConvWithStats scale_bias_relu_conv(const at::Tensor& x, const at::Tensor& scale,
                                   const at::Tensor& bias, const at::Tensor& w, int64_t stride,
                                   bool with_stats);

// The batch norm that made scale and bias: its batch statistics, weight and bias (float32).
struct BnStatistics {
  at::Tensor mean, invstd, gamma, beta;
};

// The backward of scale_bias_relu_conv from y's gradient dy: dgrad with the ReLU's gradient (its
// mask from the BN's output recomputed) and the BN's weight gradients in its epilogue, and wgrad
// reading relu(x * scale + bias) again.
BnReluConvGrads bn_relu_conv_backward(const at::Tensor& dy, const at::Tensor& x,
                                      const at::Tensor& w, const at::Tensor& scale,
                                      const at::Tensor& bias, const BnStatistics& bn,
                                      int64_t stride);

// The gradient of an input that two branches read, a convolution's (of x by w at `stride`) and
// another's: dx = dgrad(dy, w) + other, the sum in the dgrad's epilogue instead of a pass of its
// own. prepare_dgrad_add builds the graph for these shapes (meta tensors will do; other has x's)
// and says "" or why cuDNN has none; dgrad_add_engine names the engine it runs; dgrad_add runs it.
std::string prepare_dgrad_add(const at::Tensor& dy, const at::Tensor& w, const at::Tensor& other,
                              int64_t stride);
std::string dgrad_add_engine(const at::Tensor& dy, const at::Tensor& w, const at::Tensor& other,
                             int64_t stride);
// What prepare_dgrad_add asks cuDNN to build, checked on the host only (as validate() above).
std::string validate_dgrad_add(const at::Tensor& dy, const at::Tensor& w, const at::Tensor& other,
                               int64_t stride);
at::Tensor dgrad_add(const at::Tensor& dy, const at::Tensor& w, const at::Tensor& other,
                     int64_t stride);

}  // namespace trainer::conv_bn_graphs
