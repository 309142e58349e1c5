#include "src/train/optimizer.h"

#include <ATen/ATen.h>

#include "base/user_error.h"

namespace trainer {

at::Tensor lars_trust_ratios(const std::vector<at::Tensor>& params,
                             const std::vector<at::Tensor>& grads, double eta,
                             double weight_decay) {
  at::Tensor w = at::stack(at::_foreach_norm(params)).to(at::kFloat);  // (P)
  at::Tensor g = at::stack(at::_foreach_norm(grads)).to(at::kFloat);   // (P)
  at::Tensor ratio = eta * w / (g + weight_decay * w);
  return at::where((w > 0).logical_and(g > 0), ratio, at::ones_like(ratio));
}

Optimizer::Optimizer(const NamedParameters& params, const OptimizerOptions& options)
    : options_(options), groups_(2) {
  Group& weights = groups_[0];
  Group& bn_and_bias = groups_[1];
  weights.weight_decay = options.weight_decay;
  weights.lars = options.kind == OptimizerKind::kLars;
  bn_and_bias.weight_decay = options.decay_bn_and_bias ? options.weight_decay : 0.0;
  bn_and_bias.lars = weights.lars && options.decay_bn_and_bias;
  for (const auto& [name, p] : params) {
    Group& group = (p.dim() > 1) ? weights : bn_and_bias;
    group.names.push_back(name);
    group.params.push_back(p);
    if (options.momentum > 0) group.momentum.push_back(at::zeros_like(p));
  }
  const c10::Device device = params.empty() ? c10::Device(c10::kCPU) : params[0].second.device();
  lr_ = at::zeros({}, at::TensorOptions().device(device).dtype(at::kFloat));
}

void Optimizer::set_lr(double lr) { lr_.fill_(lr); }

void Optimizer::step(const std::optional<at::Tensor>& found_inf) {
  at::NoGradGuard no_grad;
  for (Group& group : groups_) step_group(group, found_inf);
}

void Optimizer::step_group(Group& group, const std::optional<at::Tensor>& found_inf) {
  std::vector<at::Tensor> params, grads, momentum;
  for (size_t i = 0; i < group.params.size(); ++i) {
    const at::Tensor& grad = group.params[i].grad();
    if (!grad.defined()) continue;  // a parameter that took no part in this step's loss
    params.push_back(group.params[i]);
    grads.push_back(grad);
    if (!group.momentum.empty()) momentum.push_back(group.momentum[i]);
  }
  if (params.empty()) return;
  double weight_decay = group.weight_decay;
  if (group.lars) {
    // g <- trust * (g + wd * w); the SGD kernel below then applies momentum and the LR.
    at::Tensor trust = lars_trust_ratios(params, grads, options_.lars_eta, weight_decay);
    at::_foreach_add_(grads, params, weight_decay);
    at::_foreach_mul_(grads, trust.unbind(0));
    weight_decay = 0;
  }
  // Momentum buffers start at zero, so buf = momentum * 0 + g on the first step either way.
  at::_fused_sgd_(params, grads, momentum, weight_decay, options_.momentum, lr_,
                  /*dampening=*/0.0, options_.nesterov, /*maximize=*/false,
                  /*is_first_step=*/false, /*grad_scale=*/std::nullopt, found_inf);
}

void Optimizer::zero_grad() {
  for (Group& group : groups_)
    for (at::Tensor& p : group.params) p.mutable_grad().reset();
}

std::vector<at::Tensor> Optimizer::grads() const {
  std::vector<at::Tensor> out;
  for (const Group& group : groups_)
    for (const at::Tensor& p : group.params)
      if (p.grad().defined()) out.push_back(p.grad());
  return out;
}

std::map<std::string, at::Tensor> Optimizer::state() const {
  std::map<std::string, at::Tensor> out;
  for (const Group& group : groups_)
    for (size_t i = 0; i < group.momentum.size(); ++i)
      out["momentum_buffer." + group.names[i]] = group.momentum[i];
  return out;
}

void Optimizer::load_state(const std::map<std::string, at::Tensor>& state) {
  at::NoGradGuard no_grad;
  for (Group& group : groups_) {
    for (size_t i = 0; i < group.momentum.size(); ++i) {
      auto it = state.find("momentum_buffer." + group.names[i]);
      USER_CHECK(it != state.end(), "checkpoint has no momentum buffer for '", group.names[i],
                 "'; it was written by another optimizer or model. Fix: resume = none");
      USER_CHECK(it->second.sizes() == group.momentum[i].sizes(), "checkpoint momentum buffer '",
                 group.names[i], "' has shape ", it->second.sizes(), ", the model needs ",
                 group.momentum[i].sizes());
      group.momentum[i].copy_(it->second);
    }
  }
}

}  // namespace trainer
