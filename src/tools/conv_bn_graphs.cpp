#include "src/tools/conv_bn_graphs.h"

#include <ATen/ATen.h>

namespace trainer {
namespace {

template <typename Attributes>
Attributes same_padding(Attributes attributes, int64_t pad) {
  return attributes.set_padding({pad, pad}).set_stride({1, 1}).set_dilation({1, 1});
}

at::Tensor channels_last_like(const at::Tensor& like, at::IntArrayRef sizes) {
  return at::empty(sizes, like.options().memory_format(c10::MemoryFormat::ChannelsLast));
}

}  // namespace

BnFinalize::BnFinalize(const at::Tensor& sum, const at::Tensor& sq_sum, const at::Tensor& gamma,
                       const at::Tensor& beta, const at::Tensor& running_mean,
                       const at::Tensor& running_var, int64_t count, float momentum, float eps) {
  for (at::Tensor* t : {&scale, &bias, &mean, &inv_var, &next_running_mean, &next_running_var})
    *t = at::empty_like(gamma);
  fe::graph::Graph& g = graph.graph();
  GraphTensor mean_in = graph.input("running_mean", running_mean);
  GraphTensor var_in = graph.input("running_var", running_var);
  GraphTensor factor = g.tensor(momentum);
  const auto out = g.bn_finalize(
      graph.input("sum", sum), graph.input("sq_sum", sq_sum), graph.input("gamma", gamma),
      graph.input("beta", beta), g.tensor(eps), g.tensor(count),
      fe::graph::BN_finalize_attributes().set_previous_running_stats(mean_in, var_in, factor));
  const std::array<at::Tensor, 6> targets = {
      scale, bias, mean, inv_var, next_running_mean, next_running_var};
  for (size_t i = 0; i < targets.size(); ++i) graph.output(out[i], targets[i]);
}

ScaleBiasReluConv::ScaleBiasReluConv(const at::Tensor& x, const at::Tensor& scale,
                                     const at::Tensor& bias, const at::Tensor& w, int64_t pad)
    : graph(x.scalar_type(), at::kFloat) {
  y = channels_last_like(x, {x.size(0), w.size(0), x.size(2), x.size(3)});
  y_sum = at::empty({w.size(0)}, x.options().dtype(at::kFloat));
  y_sq_sum = at::empty_like(y_sum);
  GraphTensor activation = graph.scale_bias_relu(graph.input("x", x), graph.input("scale", scale),
                                                 graph.input("bias", bias));
  GraphTensor out = graph.graph().conv_fprop(activation, graph.input("w", w),
                                             same_padding(fe::graph::Conv_fprop_attributes(), pad));
  graph.output(out, y);
  const auto [sum, sq_sum] = graph.graph().genstats(out, fe::graph::Genstats_attributes());
  graph.output(sum, y_sum);
  graph.output(sq_sum, y_sq_sum);
}

ConvBnBackward::ConvBnBackward(const at::Tensor& x_in, const at::Tensor& dy, const at::Tensor& w,
                               const at::Tensor& mean, const at::Tensor& inv_var,
                               const at::Tensor& gamma, const at::Tensor& beta,
                               const at::Tensor& io_scale, const at::Tensor& io_bias, int64_t pad)
    : dgrad(x_in.scalar_type(), at::kFloat),
      wgrad(x_in.scalar_type(), x_in.scalar_type()),
      x(x_in) {
  drelu = at::empty_like(x);
  dx = at::empty_like(x);
  dw = at::empty_like(w);
  for (at::Tensor& t : outputs) t = at::empty_like(gamma);

  using Mode = fe::PointwiseMode_t;
  GraphTensor dgrad_out =
      dgrad.graph().conv_dgrad(dgrad.input("dy", dy), dgrad.input("w", w),
                               same_padding(fe::graph::Conv_dgrad_attributes(), pad));
  dgrad_out->set_dim(x.sizes().vec());
  GraphTensor gx = dgrad.input("x", x), m = dgrad.input("mean", mean);
  GraphTensor v = dgrad.input("inv_var", inv_var), g = dgrad.input("gamma", gamma);
  // The BN's output recomputed, (x - mean) x inv_var x gamma + beta: where the ReLU let through.
  GraphTensor normalized = dgrad.pointwise(
      Mode::ADD,
      dgrad.pointwise(Mode::MUL, dgrad.pointwise(Mode::MUL, dgrad.pointwise(Mode::SUB, gx, m), v),
                      g),
      dgrad.input("beta", beta));
  GraphTensor relu_grad = dgrad.pointwise(Mode::RELU_BWD, dgrad_out, normalized);
  dgrad.output(relu_grad, drelu);
  const auto out =
      dgrad.graph().dbn_weight(relu_grad, gx, m, v, g, fe::graph::DBN_weight_attributes());
  for (size_t i = 0; i < outputs.size(); ++i) dgrad.output(out[i], outputs[i]);

  GraphTensor activation = wgrad.scale_bias_relu(
      wgrad.input("x", x), wgrad.input("scale", io_scale), wgrad.input("bias", io_bias));
  GraphTensor weight_grad = wgrad.graph().conv_wgrad(
      wgrad.input("dy", dy), activation, same_padding(fe::graph::Conv_wgrad_attributes(), pad));
  wgrad.output(weight_grad, dw);
}

std::string ConvBnBackward::build() {
  if (std::string failure = dgrad.build(); !failure.empty())
    return "dgrad-dReLU-dBN-weight: " + failure;
  if (std::string failure = wgrad.build(); !failure.empty())
    return "scale-bias-ReLU-wgrad: " + failure;
  return "";
}

void ConvBnBackward::run() {
  dgrad.execute();
  wgrad.execute();
  auto per_channel = [](const at::Tensor& t) { return t.view({1, -1, 1, 1}); };
  dx.copy_(drelu * per_channel(outputs[2]) + x * per_channel(outputs[3]) + per_channel(outputs[4]));
}

}  // namespace trainer
