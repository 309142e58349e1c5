#include "models/conv_bn_fusion.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>
#include <torch/autograd.h>

#include <vector>

#include "models/cuda/conv_bn_graphs.h"
#include "models/cuda/fused_batch_norm.h"
#include "models/same_conv.h"

namespace trainer {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor per_channel(const at::Tensor& t) { return t.view({1, -1, 1, 1}); }

// float32, or float64 for float64 activations (the CPU tests): what sums and statistics are in.
at::ScalarType accumulate_type(const at::Tensor& t) {
  return at::promote_types(t.scalar_type(), at::kFloat);
}

// Values per channel of an (N, C, H, W) activation: the count a BN's statistics are over.
int64_t per_channel_count(const at::Tensor& x) { return x.numel() / x.size(1); }

// ATen's side of conv_bn_graphs: the same values, from unfused ops.
conv_bn_graphs::ConvWithStats aten_conv(const at::Tensor& x, const at::Tensor& w, int64_t stride,
                                        bool with_stats) {
  const at::Tensor y = same_conv(x, w, stride);
  if (!with_stats) return {y, {}, {}};
  const at::Tensor wide = y.to(accumulate_type(y));
  return {y, wide.sum({0, 2, 3}), wide.square().sum({0, 2, 3})};
}

// relu(x * scale + bias), what the fused convolution reads; scale and bias in x's dtype.
at::Tensor scale_bias_relu(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& bias) {
  return (x * per_channel(scale) + per_channel(bias)).relu();
}

// The BN's batch statistics and its scale and bias for this batch, from its input's sums.
struct BnCoefficients {
  at::Tensor mean, invstd, scale, bias;  // float32 (C)
};

// From the sums over `count` values per channel, as BatchNorm2d::forward in training mode: the
// biased variance normalises, the unbiased one goes into running_var; the running statistics and
// the batch count change as there.
BnCoefficients finalize(torch::nn::BatchNorm2dImpl& bn, const at::Tensor& sum,
                        const at::Tensor& sq_sum, int64_t count) {
  at::NoGradGuard no_grad;
  const double factor = batch_norm_averaging_factor(bn);
  const double n = static_cast<double>(count);
  BnCoefficients c;
  c.mean = sum / n;
  const at::Tensor var = (sq_sum / n - c.mean.square()).clamp_min_(0);
  c.invstd = (var + bn.options.eps()).rsqrt_();
  c.scale = bn.weight * c.invstd;
  c.bias = bn.bias - c.mean * c.scale;
  bn.running_mean.mul_(1 - factor).add_(c.mean, factor);
  bn.running_var.mul_(1 - factor).add_(var, factor * n / (n - 1));
  return c;
}

variable_list outputs(const conv_bn_graphs::ConvWithStats& out, AutogradContext* ctx) {
  if (!out.sum.defined()) return {out.y};
  ctx->mark_non_differentiable({out.sum, out.sq_sum});
  return {out.y, out.sum, out.sq_sum};
}

ConvOutput as_conv_output(const variable_list& out) {
  return {out[0], out.size() > 1 ? out[1] : at::Tensor(), out.size() > 2 ? out[2] : at::Tensor()};
}

// conv_with_stats as one differentiable op: y, sum, sq_sum from x, w.
class ConvStats : public torch::autograd::Function<ConvStats> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                               int64_t stride, int64_t backend) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["stride"] = stride;
    // Without a conv-genstats engine, ATen's convolution and reductions (one more read).
    if (static_cast<ConvBnBackend>(backend) == ConvBnBackend::kCudnn &&
        conv_bn_graphs::prepare(x, w, stride, /*through_bn=*/false, /*with_stats=*/true).empty())
      return outputs(conv_bn_graphs::conv_stats(x, w, stride), ctx);
    return outputs(aten_conv(x, w, stride, /*with_stats=*/true), ctx);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1];
    const int64_t stride = ctx->saved_data["stride"].toInt();
    auto [dx, dw] = same_conv_gradients(grads[0], x, w, stride, ctx->needs_input_grad(0),
                                        ctx->needs_input_grad(1));
    return {dx, dw, at::Tensor(), at::Tensor()};
  }
};

struct Grads {
  at::Tensor dx, dgamma, dbeta, dw;
};

// The backward of conv(relu(bn(x)), w) in ATen's ops, step for step as cuDNN's graphs: the
// conv's gradients through the activation recomputed, the ReLU's mask from the BN's output
// recomputed from its statistics, then the BN's gradients, counting the batch statistics'
// dependence on x.
Grads aten_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                    const at::Tensor& io_scale, const at::Tensor& io_bias,
                    const conv_bn_graphs::BnStatistics& bn, int64_t stride) {
  auto [d_activation, dw] =
      same_conv_gradients(dy, scale_bias_relu(x, io_scale, io_bias), w, stride, true, true);
  const at::Tensor xhat =
      (x.to(accumulate_type(x)) - per_channel(bn.mean)) * per_channel(bn.invstd);
  const at::Tensor pre_relu = xhat * per_channel(bn.gamma) + per_channel(bn.beta);
  const at::Tensor drelu = d_activation.to(accumulate_type(x)) * (pre_relu > 0);
  const at::Tensor dbeta = drelu.sum({0, 2, 3}), dgamma = (drelu * xhat).sum({0, 2, 3});
  const double n = static_cast<double>(per_channel_count(x));
  const at::Tensor dx = per_channel(bn.gamma * bn.invstd) *
                        (drelu - per_channel(dbeta) / n - xhat * per_channel(dgamma) / n);
  return {dx.to(x.scalar_type()), dgamma, dbeta, dw};
}

// The same from cuDNN's graphs; the BN's input gradient is ATen's SyncBatchNorm element-wise
// kernel, which takes the sums dgrad's epilogue made (one pass over drelu and x).
Grads cudnn_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                     const at::Tensor& io_scale, const at::Tensor& io_bias,
                     const conv_bn_graphs::BnStatistics& bn, int64_t stride) {
  const conv_bn_graphs::BnReluConvGrads g =
      conv_bn_graphs::bn_relu_conv_backward(dy, x, w, io_scale, io_bias, bn, stride);
  const at::Tensor count = at::full({1}, per_channel_count(x), x.options().dtype(at::kInt));
  const at::Tensor dx = at::batch_norm_backward_elemt(g.drelu, x, bn.mean, bn.invstd, bn.gamma,
                                                      g.dbeta, g.dgamma / bn.invstd, count);
  return {dx, g.dgamma, g.dbeta, g.dw};
}

// bn_relu_conv as one differentiable op over x, the BN's weight and bias, and w. The batch
// statistics, scale and bias come in already finalized (no gradient of their own).
class BnReluConv : public torch::autograd::Function<BnReluConv> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& gamma,
                               const at::Tensor& beta, const at::Tensor& w, const at::Tensor& mean,
                               const at::Tensor& invstd, const at::Tensor& scale,
                               const at::Tensor& bias, int64_t stride, bool with_stats,
                               int64_t backend) {
    // In x's dtype, as the fused convolution's prologue reads them; backward reads the same.
    const at::Tensor io_scale = scale.to(x.scalar_type()), io_bias = bias.to(x.scalar_type());
    ctx->save_for_backward({x, w, io_scale, io_bias, mean, invstd, gamma, beta});
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["backend"] = backend;
    if (static_cast<ConvBnBackend>(backend) == ConvBnBackend::kCudnn)
      return outputs(
          conv_bn_graphs::scale_bias_relu_conv(x, io_scale, io_bias, w, stride, with_stats), ctx);
    return outputs(aten_conv(scale_bias_relu(x, io_scale, io_bias), w, stride, with_stats), ctx);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const at::Tensor &x = s[0], &w = s[1], &io_scale = s[2], &io_bias = s[3];
    const conv_bn_graphs::BnStatistics bn{s[4], s[5], s[6], s[7]};
    const int64_t stride = ctx->saved_data["stride"].toInt();
    const at::Tensor dy = grads[0].to(x.scalar_type()).contiguous(x.suggest_memory_format());
    const bool cudnn =
        static_cast<ConvBnBackend>(ctx->saved_data["backend"].toInt()) == ConvBnBackend::kCudnn;
    const Grads g = cudnn ? cudnn_backward(dy, x, w, io_scale, io_bias, bn, stride)
                          : aten_backward(dy, x, w, io_scale, io_bias, bn, stride);
    return {g.dx,         g.dgamma,     g.dbeta,      g.dw,         at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

ConvOutput conv_with_stats(const at::Tensor& x, const at::Tensor& w, int64_t stride,
                           ConvBnBackend backend) {
  return as_conv_output(ConvStats::apply(x, w, stride, static_cast<int64_t>(backend)));
}

ConvOutput bn_relu_conv(torch::nn::BatchNorm2dImpl& bn, const ConvOutput& x, const at::Tensor& w,
                        int64_t stride, bool with_stats, ConvBnBackend backend) {
  const BnCoefficients c = finalize(bn, x.sum, x.sq_sum, per_channel_count(x.y));
  return as_conv_output(BnReluConv::apply(x.y, bn.weight, bn.bias, w, c.mean, c.invstd, c.scale,
                                          c.bias, stride, with_stats,
                                          static_cast<int64_t>(backend)));
}

std::string cudnn_bottleneck_failure(const at::Tensor& x, const at::Tensor& w1,
                                     const at::Tensor& w2, const at::Tensor& w3, int64_t stride) {
  const at::Tensor y1 =
      at::empty({x.size(0), w1.size(0), x.size(2), x.size(3)}, x.options().device(at::kMeta));
  const at::Tensor y2 =
      at::empty({x.size(0), w2.size(0), (x.size(2) - 1) / stride + 1, (x.size(3) - 1) / stride + 1},
                y1.options());
  // conv1's graph is built here too, before any step is recorded as a CUDA graph; without it
  // conv1 takes ATen's convolution and reductions, and the block still fuses.
  if (std::string failure = conv_bn_graphs::prepare(x, w1, 1, /*through_bn=*/false, true);
      !failure.empty())
    spdlog::debug("fused_conv_batch_norm: conv1 {} without its statistics fused: {}",
                  c10::str(x.sizes()), failure);
  std::string failure = conv_bn_graphs::prepare(y1, w2, stride, true, true);
  if (failure.empty()) failure = conv_bn_graphs::prepare(y2, w3, 1, true, false);
  return failure;
}

}  // namespace trainer
