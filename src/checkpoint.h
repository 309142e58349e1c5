// Checkpoints in the format Python's torch.load reads: a dict with the torchvision-compatible
// state_dict under "model", the optimizer's momentum buffers, the loss scaler, epoch, step and the
// resolved config. Written atomically (temporary file, fsync, rename); the newest K are kept.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <filesystem>
#include <map>
#include <optional>
#include <string>

namespace trainer {

using TensorMap = std::map<std::string, at::Tensor>;

struct Checkpoint {
  TensorMap model;      // parameters and buffers by torchvision name, CPU
  TensorMap optimizer;  // momentum buffers by "momentum_buffer.<parameter name>", CPU
  double loss_scale = 1.0;
  int64_t loss_scale_growth_tracker = 0;
  int64_t step = 0;    // optimisation steps completed
  int64_t epoch = 0;   // epoch the next step belongs to
  std::string config;  // resolved configuration, TOML
};

// Parameters and buffers of `module` by dotted name, as CPU copies (state_dict()).
TensorMap state_dict(const torch::nn::Module& module);
// Copies `state` into `module`; every name must be present with the same shape (strict=True).
void load_state_dict(torch::nn::Module& module, const TensorMap& state);

void save_checkpoint(const Checkpoint& checkpoint, const std::filesystem::path& path);
Checkpoint load_checkpoint(const std::filesystem::path& path);

// <dir>/checkpoint-<step, 9 digits>.pt: names sort by step.
std::filesystem::path checkpoint_path(const std::filesystem::path& dir, int64_t step);
std::optional<std::filesystem::path> newest_checkpoint(const std::filesystem::path& dir);
// Deletes all but the newest `keep` checkpoints in `dir`.
void prune_checkpoints(const std::filesystem::path& dir, int64_t keep);

}  // namespace trainer
