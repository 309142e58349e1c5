#include "models/residual_gradient.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>
#include <torch/autograd.h>

#include <mutex>
#include <set>
#include <string>

#include "models/cuda/conv_bn_graphs.h"
#include "models/same_conv.h"

namespace trainer {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Says once per shape that its blocks sum the gradients apart, and why.
void warn_once(const std::string& shape, const std::string& failure) {
  static std::mutex mutex;
  static std::set<std::string> said;
  const std::lock_guard<std::mutex> lock(mutex);
  if (said.insert(shape).second)
    spdlog::warn("fused_residual_gradient: a block's input {} gets its gradients summed apart: {}",
                 shape, failure);
}

// Whether cuDNN's dgrad-add graph takes these tensors: all of one dtype and layout it runs, and
// built for their shapes.
bool cudnn_dgrad_add_ready(const at::Tensor& dy, const at::Tensor& w, const at::Tensor& other,
                           int64_t stride) {
  if (!residual_gradient_fusable(dy) || !residual_gradient_fusable(other) ||
      !w.is_contiguous(at::MemoryFormat::ChannelsLast) || dy.scalar_type() != w.scalar_type() ||
      dy.scalar_type() != other.scalar_type())
    return false;
  const std::string failure = conv_bn_graphs::prepare_dgrad_add(dy, w, other, stride);
  if (!failure.empty()) warn_once(c10::str(other.sizes(), " ", other.scalar_type()), failure);
  return failure.empty();
}

class ConvBesideShortcutOp : public torch::autograd::Function<ConvBesideShortcutOp> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                               int64_t stride, int64_t backend) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["backend"] = backend;
    // x itself as the second output: autograd hands the shortcut a view of it, with this op as
    // the view's gradient function, so that x's two gradients meet in backward() below.
    return {same_conv(x, w, stride), x};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1];
    const int64_t stride = ctx->saved_data["stride"].toInt();
    const bool cudnn =
        static_cast<ConvBnBackend>(ctx->saved_data["backend"].toInt()) == ConvBnBackend::kCudnn;
    const at::Tensor &dy = grads[0], &d_shortcut = grads[1];
    const bool x_grad = ctx->needs_input_grad(0), w_grad = ctx->needs_input_grad(1);
    if (!dy.defined()) return {d_shortcut, at::Tensor(), at::Tensor(), at::Tensor()};
    if (x_grad && d_shortcut.defined() && cudnn &&
        cudnn_dgrad_add_ready(dy, w, d_shortcut, stride)) {
      const at::Tensor dw =
          w_grad ? std::get<1>(same_conv_gradients(dy, x, w, stride, false, true)) : at::Tensor();
      return {conv_bn_graphs::dgrad_add(dy, w, d_shortcut, stride), dw, at::Tensor(), at::Tensor()};
    }
    auto [dx, dw] = same_conv_gradients(dy, x, w, stride, x_grad, w_grad);
    if (x_grad && d_shortcut.defined()) dx = dx + d_shortcut;
    return {dx, dw, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool residual_gradient_fusable(const at::Tensor& x) {
  const bool low_precision = x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16;
  return x.is_cuda() && low_precision && x.dim() == 4 &&
         x.is_contiguous(at::MemoryFormat::ChannelsLast);
}

ConvBesideShortcut conv_beside_shortcut(const at::Tensor& x, const at::Tensor& w, int64_t stride,
                                        ConvBnBackend backend) {
  const variable_list out =
      ConvBesideShortcutOp::apply(x, w, stride, static_cast<int64_t>(backend));
  return {out[0], out[1]};
}

}  // namespace trainer
