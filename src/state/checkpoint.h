// Checkpoints in the format Python's torch.load reads: a dict with the torchvision-compatible
// state_dict under "model", the optimizer's momentum buffers, the loss scaler, epoch, step, the
// resolved config and the data's class names. Written atomically (temporary file, fsync, rename);
// the newest K are kept.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "data/datasets/class_names.h"

namespace trainer {

using TensorMap = std::map<std::string, at::Tensor>;

// Where a run stands, in images: enough to continue it exactly at any world size or batch size
// (Note [Elastic epoch order] in data/sources/step_shares.h).
struct Progress {
  int64_t step = 0;              // optimisation steps completed
  int64_t epoch = 0;             // epoch the next step belongs to
  int64_t samples_in_epoch = 0;  // images of that epoch already trained: its order's position
  // The evaluation due at the end of the epoch before is still to run: a stop signal came at
  // that epoch's last step, and the checkpoint came first.
  bool eval_pending = false;
  // An evaluation reached target_top1: the run is over, whatever epochs it had left.
  bool target_reached = false;
};

struct Checkpoint {
  TensorMap model;      // parameters and buffers by torchvision name, CPU
  TensorMap optimizer;  // momentum buffers by "momentum_buffer.<parameter name>", CPU
  TensorMap ema;        // the EMA of the weights, a state dict like `model`; empty when off
  // What `model` is: the arch ("resnet50"), "-blurpool" added for that variant, whose weights
  // have torchvision's names and shapes but compute something else.
  std::string architecture;
  double loss_scale = 1.0;
  int64_t loss_scale_growth_tracker = 0;
  Progress progress;
  // The run that wrote it, for the log and checks at resume.
  int64_t world_size = 1;
  int64_t global_batch = 0;       // images per step
  int64_t samples_per_epoch = 0;  // images in a training epoch
  std::string config;             // resolved configuration, TOML
  // The names of the classes the model was trained on, logit i being classes[i]; saved as the
  // lists of str "class_synsets" and "class_texts" (absent when empty: the data had none).
  std::vector<ClassName> classes;
};

// The class names a checkpoint's dict holds; empty when it holds none. `source` names the file
// in the error when the entries are not lists of str of one length.
std::vector<ClassName> read_checkpoint_classes(const c10::impl::GenericDict& dict,
                                               const std::string& source);

// Parameters and buffers of `module` by dotted name, as CPU copies (state_dict()).
TensorMap state_dict(const torch::nn::Module& module);
// Copies `state` into `module`: each of its parameters and buffers must be there with its shape,
// and nothing else (strict=True); an error names the first that is not, and `source` (the file).
// The entries named in `keep_if_shape_differs` keep the module's values when their shapes differ;
// returns those kept.
std::vector<std::string> load_state_dict(torch::nn::Module& module, const TensorMap& state,
                                         const std::string& source = "state_dict",
                                         const std::set<std::string>& keep_if_shape_differs = {});

void save_checkpoint(const Checkpoint& checkpoint, const std::filesystem::path& path);
Checkpoint load_checkpoint(const std::filesystem::path& path);

// <dir>/checkpoint-<step, 9 digits>.pt: names sort by step.
std::filesystem::path checkpoint_path(const std::filesystem::path& dir, int64_t step);
// Whether the file's name is one checkpoint_path makes, and the step in such a name.
bool is_checkpoint_file_name(const std::filesystem::path& path);
int64_t checkpoint_step(const std::filesystem::path& path);
// The checkpoints in `dir`, oldest (lowest step) first.
std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& dir);
std::optional<std::filesystem::path> newest_checkpoint(const std::filesystem::path& dir);
// Deletes all but the newest `keep` checkpoints in `dir`.
void prune_checkpoints(const std::filesystem::path& dir, int64_t keep);
// Deletes what checkpoint writes killed before their rename left in `dir` (as large as a
// checkpoint each); returns how many. For the run's one writer, at start.
int remove_unfinished_checkpoints(const std::filesystem::path& dir);

}  // namespace trainer
