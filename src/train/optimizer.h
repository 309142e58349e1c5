// SGD with momentum (Nesterov optional) and LARS, as one fused update per parameter group.
// Parameters split into two groups: weights of convolutions and fully connected layers, and
// "BN and bias" (every 1-D parameter), which by default get no weight decay and no LARS scaling,
// as in the large-batch literature. Both optimizers end in PyTorch's fused SGD kernel, which
// skips the whole update on the device when the loss scaler found inf/NaN gradients. The learning
// rate lives on the device too, so that a step recorded as a CUDA graph reads each step's rate
// (Note [The step as a CUDA graph]).
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace trainer {

enum class OptimizerKind { kSgd, kLars };

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kSgd;
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 1e-4;
  bool decay_bn_and_bias = false;
  double lars_eta = 0.001;
};

// LARS trust ratio per parameter: eta * ||w|| / (||g|| + wd * ||w||), or 1 where either norm is 0.
// Returns a 1-D float tensor with one ratio per parameter, on the parameters' device.
at::Tensor lars_trust_ratios(const std::vector<at::Tensor>& params,
                             const std::vector<at::Tensor>& grads, double eta, double weight_decay);

class Optimizer {
 public:
  using NamedParameters = std::vector<std::pair<std::string, at::Tensor>>;
  Optimizer(const NamedParameters& params, const OptimizerOptions& options);

  // The learning rate of the steps from now on: a write on the device's stream, no wait.
  void set_lr(double lr);
  // One update at the rate set_lr wrote last. When found_inf (0-dim, device) is 1 nothing changes.
  void step(const std::optional<at::Tensor>& found_inf = std::nullopt);
  void zero_grad();                       // gradients to none
  std::vector<at::Tensor> grads() const;  // the defined gradients of all parameters

  // Momentum buffers by parameter name, for checkpoints.
  std::map<std::string, at::Tensor> state() const;
  void load_state(const std::map<std::string, at::Tensor>& state);

 private:
  struct Group {
    std::vector<std::string> names;
    std::vector<at::Tensor> params;
    std::vector<at::Tensor> momentum;  // one buffer per parameter; empty when momentum == 0
    double weight_decay = 0;
    bool lars = false;
  };
  void step_group(Group& group, const std::optional<at::Tensor>& found_inf);

  OptimizerOptions options_;
  at::Tensor lr_;              // 0-dim float32 on the parameters' device (what the kernel reads)
  std::vector<Group> groups_;  // [weights, BN and biases]
};

}  // namespace trainer
