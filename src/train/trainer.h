// One model replica and its optimisation state on one device: the training step (device input,
// mixed-precision forward, scaled backward with gradients averaged over ranks, fused update),
// evaluation, and checkpoint state. With a process group, rank 0's initial weights are broadcast
// so every rank starts identical. Nothing here waits for the device: losses stay device tensors
// until a caller reads them.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/MemoryFormat.h>

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/sources/batch_source.h"
#include "models/resnet.h"
#include "src/dist/gradient_reducer.h"
#include "src/dist/process_group.h"
#include "src/state/checkpoint.h"
#include "src/state/class_match.h"
#include "src/train/batch_mixing.h"
#include "src/train/loss.h"
#include "src/train/loss_scaler.h"
#include "src/train/optimizer.h"
#include "src/train/step_graph.h"
#include "src/train/step_profile.h"
#include "src/train/weight_average.h"

namespace trainer {

struct EvalResult {
  int64_t images = 0;
  int64_t top1_correct = 0;
  int64_t top5_correct = 0;
  // Per class index, over all ranks, when asked for (evaluate's per_class); else empty.
  std::vector<int64_t> class_images;
  std::vector<int64_t> class_top1_correct;
  double top1() const { return images ? 100.0 * top1_correct / images : 0.0; }  // percent
  double top5() const { return images ? 100.0 * top5_correct / images : 0.0; }  // percent
};

// The trainer's own options, made from the configuration in src/part_options.cpp.
struct TrainerOptions {
  ResNetOptions model;
  std::string architecture =
      "resnet50";      // as checkpoints name it: "resnet50-blurpool" and the like
  uint64_t seed = 42;  // the initial weights, and each batch's MixUp/CutMix draw
  std::optional<at::ScalarType> autocast_dtype;  // kHalf / kBFloat16: mixed precision; none: fp32
  bool channels_last = true;                     // NHWC weights and activations (GPU only)
  bool cuda_graph = false;  // the step as a CUDA graph on the GPU (Note [The step as a CUDA graph])
  bool classifier_only = false;  // a linear probe: only fc trains, the rest (BN too) stays frozen
  OptimizerOptions optimizer;
  ReducerOptions reducer;  // with a launched group
  LossScalerOptions scaler;
  LossOptions loss;
  // The step's gradient: the mean over its images times this (Config::grad_scale), folded into
  // each micro-batch's loss weight; the losses returned stay unscaled.
  double grad_scale = 1.0;
  MixingOptions mixing;
  double ema_decay = 0;                        // per EMA update; 0: no EMA
  int64_t ema_every_steps = 1;                 // steps between EMA updates
  EmaBuffers ema_buffers = EmaBuffers::kCopy;  // Note [EMA buffers]
  bool eval_flip = false;       // evaluation: the mean logits of each image and its mirror
  int world_size = 1;           // for the MixUp/CutMix draw and checkpoints
  int64_t images_per_step = 0;  // over all ranks, for checkpoints
  std::string resolved_config;  // the run's config.toml, kept in checkpoints
  NamedClasses classes;         // the data's class names, kept in checkpoints; empty: none
  ProfileOptions profile;       // a trace of some steps (profile_steps); off by default
};

class Trainer {
 public:
  // Builds the model (seeded by options.seed) on `device`. With a `group` launched by mpirun
  // (collective: every rank constructs its Trainer together), parameters and buffers come from
  // rank 0 and gradients are averaged over the ranks.
  Trainer(const TrainerOptions& options, c10::Device device, ProcessGroup* group = nullptr);

  // One optimisation step on `batch` at learning rate `lr`. Returns the batch's mean loss, a
  // 0-dim float device tensor (0 for an empty batch). In fp16, a step with overflowing gradients
  // changes no weights. `loss_weight` scales this rank's loss in the average over ranks: the
  // rank's share of the step's images times the world size (1 when every rank has a full batch;
  // Note [Elastic epoch order]). An empty batch, a rank's share of a short last step, only takes
  // part in the gradient average (contributing zeros) and the update.
  at::Tensor train_step(const Batch& batch, double lr, double loss_weight = 1.0);

  // The same step over several batches (micro-batches) of this rank: begin_step at learning rate
  // `lr`, then accumulate each (gradients summed, averaged over ranks once, after the `last`
  // one's backward), then end_step's one update (made by accumulate already when the step is a
  // CUDA graph's). `loss_weight` as in train_step, per micro-batch: its images times the world
  // size over the step's images. accumulate returns the micro-batch's mean loss (0 when empty).
  void begin_step(double lr);
  at::Tensor accumulate(const Batch& batch, double loss_weight, bool last);
  // `ema_copies`: the EMA update of this step, if any, copies the weights (Note [EMA warmup
  // reset]).
  void end_step(bool ema_copies = false);

  // Top-1/top-5 over every batch of one epoch of `source`, in eval mode (BN running statistics).
  // With a group: each rank evaluates its shard and the counts are summed over ranks. `ema`:
  // the EMA of the weights instead (has_ema()). `per_class`: also top-1 per class, counted on
  // the device and read once at the end.
  EvalResult evaluate(BatchSource& source, bool ema = false, bool per_class = false);
  bool has_ema() const { return ema_ != nullptr; }

  // Copies rank 0's BN running statistics to every rank (they drift apart, each rank seeing its
  // own batches), the EMA's averaged ones too, so evaluation and checkpoints use one model.
  // Collective.
  void sync_buffers();
  // Forward + backward time of the last step on this rank, ms (reads the device: log intervals);
  // a step replayed from the CUDA graph counts its all-reduce and update too.
  double last_step_compute_ms() const;
  GradientReducer* reducer() { return reducer_.get(); }
  ProcessGroup* group() const { return group_; }
  bool is_rank0() const { return !group_ || group_->rank() == 0; }

  // The state to save (reads the device) at `progress`, and to restore.
  Checkpoint checkpoint(const Progress& progress) const;
  void restore(const Checkpoint& checkpoint);
  // Weights to start from or to evaluate (every rank loads the same file, so the replicas stay
  // equal). `source` names the file in errors. With `keep_new_classifier` a classifier whose
  // width differs from the file's keeps its initialisation; returns whether it did.
  bool load_weights(const TensorMap& weights, const std::string& source, bool keep_new_classifier);

  ResNet& model() { return model_; }
  // Steps run by replaying a CUDA graph (cuda_graph), and the graphs recorded.
  int64_t graph_replays() const { return graph_ ? graph_->replays() : 0; }
  int64_t graph_captures() const { return graph_ ? graph_->captures() : 0; }
  // The model's architecture as checkpoints name it: "resnet50", "resnet50-blurpool".
  std::string architecture() const;
  // The class names of the data this run trains or evaluates on, as its checkpoints keep them.
  const NamedClasses& classes() const { return options_.classes; }
  const LossScaler& loss_scaler() const { return scaler_; }
  c10::Device device() const { return device_; }
  // Images of one batch prepared for the model: (N, 3, H, W) normalised, compute dtype and layout.
  at::Tensor prepare_images(const at::Tensor& images) const;

 private:
  // Forward and scaled backward of a non-empty batch's step_inputs; returns its mean loss
  // (detached).
  at::Tensor forward_backward(const at::Tensor& images, const at::Tensor& targets,
                              double loss_weight);
  // A step of one micro-batch through graph_: forward, backward, the gradient all-reduce and the
  // update.
  at::Tensor graphed_step(const Batch& batch, double loss_weight);
  // The update from the averaged gradients: unscaled, the optimizer's step (skipped on the device
  // when they overflowed) and the loss scale's.
  void update_weights();
  // Waits for the step kStepsAhead back to end on the device (Note [The host's lead]).
  void limit_lead();
  // The batch's images and targets after MixUp or CutMix (class indices when both are off).
  std::pair<at::Tensor, at::Tensor> mix(const at::Tensor& images, const at::Tensor& labels);
  // The batch on the device as the step takes it: (N, 3, H, W) images, prepared and mixed, and
  // targets, (N) class indices or (N, classes) probabilities when mixed.
  std::pair<at::Tensor, at::Tensor> step_inputs(const Batch& batch);
  // Training mode for the layers that train: a linear probe keeps the frozen layers' batch norm
  // on its running statistics.
  void set_training_mode();
  // Fills `result`'s per-class counts from `class_counts` (2, classes), summed over the ranks.
  void add_class_counts(const at::Tensor& class_counts, EvalResult& result);

  const TrainerOptions options_;
  c10::Device device_;
  std::optional<at::ScalarType> autocast_dtype_;  // kHalf / kBFloat16; nullopt in fp32
  at::ScalarType input_dtype_;                    // dtype the images are normalised into
  c10::MemoryFormat memory_format_;               // channels_last on the GPU when enabled
  ProcessGroup* group_;                           // null: a world of one without MPI
  ResNet model_;
  std::unique_ptr<Optimizer> optimizer_;      // built after the model's final layout
  std::unique_ptr<GradientReducer> reducer_;  // under mpirun only
  LossScaler scaler_;
  LossOptions loss_;
  MixingOptions mixing_;
  int64_t micro_batch_ = 0;           // micro-batches of this step so far (the mixing draw)
  std::unique_ptr<StepGraph> graph_;  // with cuda_graph on the GPU
  bool graphed_ = false;              // this step's all-reduce and update ran in graph_
  std::deque<at::cuda::CUDAEvent> steps_on_device_;  // the last steps' ends (limit_lead)
  std::unique_ptr<WeightAverage> ema_;               // with ema_decay or ema_half_life_images set
  // Start of forward / end of backward of the last step: compute time per rank, for stragglers.
  std::optional<at::cuda::CUDAEvent> step_start_, step_backward_done_;
  double last_step_host_ms_ = 0;  // the same on the CPU, where steps run synchronously
  std::chrono::steady_clock::time_point step_host_start_;
  int64_t step_ = 0;  // steps taken, resumed ones included (named by timeouts)
  StepProfiler profiler_;
  std::optional<StepPhase> step_phase_;  // "step N", from begin_step to end_step
};

}  // namespace trainer
