// The convolutions of a ResNet's blocks as the fused ops run them: square kernels (1x1 or 3x3), one
// stride both ways, "same" padding, no bias, no groups. One place for the padding (the model's
// convolutions and BlurPool's blur, the cuDNN graphs) and for the ATen forward and gradients, so
// that the fused ops' ATen paths, their fallbacks and their cuDNN graphs cannot disagree on a
// parameter.
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace trainer {

// Of an odd square kernel of `kernel` taps, or of weight `w` (out, in / groups, k, k).
inline int64_t same_padding(int64_t kernel) { return kernel / 2; }
inline int64_t same_padding(const at::Tensor& w) { return same_padding(w.size(2)); }

inline at::Tensor same_conv(const at::Tensor& x, const at::Tensor& w, int64_t stride) {
  return at::conv2d(x, w, /*bias=*/{}, stride, same_padding(w));
}

// same_conv's gradients for x (when x_grad; else undefined) and for w (when w_grad).
inline std::tuple<at::Tensor, at::Tensor> same_conv_gradients(const at::Tensor& dy,
                                                              const at::Tensor& x,
                                                              const at::Tensor& w, int64_t stride,
                                                              bool x_grad, bool w_grad) {
  const int64_t pad = same_padding(w);
  auto [dx, dw, unused] = at::convolution_backward(
      dy, x, w, /*bias_sizes=*/std::nullopt, {stride, stride}, {pad, pad}, /*dilation=*/{1, 1},
      /*transposed=*/false, /*output_padding=*/{0, 0}, /*groups=*/1, {x_grad, w_grad, false});
  return {dx, dw};
}

}  // namespace trainer
