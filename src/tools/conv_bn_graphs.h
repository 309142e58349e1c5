// The convolution-side batch norm fusion of NVIDIA's MLPerf ResNet-50 as cudnn-frontend graphs
// over ATen tensors, for a convolution that reads a BN+ReLU: conv(relu(bn(x)), w), stride 1.
// Forward: BnFinalize turns the sums of the BN's input into its scale and bias; ScaleBiasReluConv
// applies them and the ReLU as the convolution reads x, and writes the sums of its output for the
// next BN. Backward: ConvBnBackward. Each graph's tensors are made here; build() says whether
// cuDNN has engines for them on this GPU ("" when it has, else why not).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <string>

#include "src/tools/cudnn_graph.h"

namespace trainer {

// From a BN input's per-channel sum and sum of squares over `count` values: the batch's mean and
// inverse standard deviation, the BN's scale (gamma / std) and bias (beta - mean x scale), and
// its running statistics after this batch, at `momentum` (PyTorch's: new = (1 - m) old + m batch).
struct BnFinalize {
  BnFinalize(const at::Tensor& sum, const at::Tensor& sq_sum, const at::Tensor& gamma,
             const at::Tensor& beta, const at::Tensor& running_mean, const at::Tensor& running_var,
             int64_t count, float momentum, float eps);
  CudnnGraph graph{at::kFloat, at::kFloat};
  at::Tensor scale, bias, mean, inv_var, next_running_mean, next_running_var;  // float32 (C)
};

// y = conv(relu(x * scale + bias), w) with the per-channel sum and sum of squares of y. x, w and
// y channels_last in the activations' dtype, as scale and bias (C).
struct ScaleBiasReluConv {
  ScaleBiasReluConv(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& bias,
                    const at::Tensor& w, int64_t pad);
  CudnnGraph graph;
  at::Tensor y, y_sum, y_sq_sum;  // y_sum, y_sq_sum: float32 (K)
};

// The backward of y = conv(relu(bn(x)), w) given dy, from the forward's batch statistics (mean,
// inv_var) and the BN's scale and bias in the activations' dtype (io_scale, io_bias: those the
// forward applied): dgrad-dReLU-dBN-weight gives the ReLU's input gradient, the BN's weight
// gradients and the coefficients of its input gradient; scale-bias-ReLU-wgrad the convolution's
// weight gradient from the activation recomputed; dx = a * drelu + b * x + c, here with ATen's
// element-wise ops (an upper bound on the one pass a fused kernel makes).
struct ConvBnBackward {
  ConvBnBackward(const at::Tensor& x, const at::Tensor& dy, const at::Tensor& w,
                 const at::Tensor& mean, const at::Tensor& inv_var, const at::Tensor& gamma,
                 const at::Tensor& beta, const at::Tensor& io_scale, const at::Tensor& io_bias,
                 int64_t pad);
  std::string build();
  void run();
  CudnnGraph dgrad, wgrad;
  at::Tensor x, drelu, dw, dx;
  // float32 (C): dgamma, dbeta, and dx's coefficients of drelu, of x, and its constant.
  std::array<at::Tensor, 5> outputs;
};

}  // namespace trainer
