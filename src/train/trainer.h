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
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/sources/batch_source.h"
#include "models/resnet.h"
#include "src/distributed/gradient_reducer.h"
#include "src/distributed/process_group.h"
#include "src/state/checkpoint.h"
#include "src/state/class_match.h"
#include "src/train/batch_mixing.h"
#include "src/train/loss.h"
#include "src/train/loss_scaler.h"
#include "src/train/optimizer.h"
#include "src/train/step_graph.h"
#include "src/train/step_profile.h"
#include "src/train/step_timer.h"
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
  int64_t micro_batches = 1;     // per step and rank, as configured (a short step may have fewer)
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

// Whether a trainer on `device` keeps its step as a CUDA graph: with cuda_graph, on the GPU, when a
// step is one micro-batch per rank.
bool keeps_step_graph(const TrainerOptions& options, c10::Device device);

// What a training step takes besides its batches.
struct StepInputs {
  double lr = 0;
  int64_t micro_batches = 1;  // this rank's batches in the step (Note [Fixed global batch])
  // The step's images over all ranks. Each micro-batch's loss is weighted by its images times the
  // world size over these, so that a short step (an epoch's last, dealt unevenly, a share possibly
  // empty; Note [Elastic epoch order]) averages its gradient over its images. 0: every
  // micro-batch of every rank is a full one, of weight 1.
  int64_t step_images = 0;
  bool ema_copies = false;  // the step's EMA update, if any, copies the weights (Note [EMA warmup
                            // reset])
};

class Trainer {
 public:
  // Builds the model (seeded by options.seed) on `device`. With a `group` launched by mpirun
  // (collective: every rank constructs its Trainer together), parameters and buffers come from
  // rank 0 and gradients are averaged over the ranks.
  Trainer(const TrainerOptions& options, c10::Device device, ProcessGroup* group = nullptr);

  // One optimisation step (Note [The training step]): this rank's `inputs.micro_batches`
  // batches, each taken from `next_batch` when the step gets to it, forward and backward; their
  // gradients averaged over the ranks once, after the last one's backward; one update at
  // `inputs.lr`. Returns the mean loss over this rank's images, a 0-dim float device tensor (0
  // when it had none). In fp16, a step with overflowing gradients changes no weights.
  at::Tensor step(const StepInputs& inputs, const std::function<Batch()>& next_batch);
  // A step of one batch (benchmarks, tests).
  at::Tensor train_step(const Batch& batch, double lr, int64_t step_images = 0);

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
  // Where this rank's steps went since the last call, means per step (reads the device: log
  // intervals only).
  StepTimes take_step_times() { return step_timer_.take(); }
  GradientReducer* reducer() { return reducer_.get(); }
  ProcessGroup* group() const { return group_; }
  bool is_rank0() const { return !group_ || group_->rank() == 0; }
  // The run's config.toml, as its checkpoints keep it.
  const std::string& resolved_config() const { return options_.resolved_config; }

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
  // One micro-batch on the device as the step takes it: images (N, 3, H, W), prepared and mixed,
  // and targets, (N) class indices or (N, classes) probabilities when mixed; both undefined for
  // an empty share. `weight` as StepInputs::step_images says.
  struct MicroBatch {
    at::Tensor images, targets;
    int64_t rows = 0;
    double weight = 1.0;
  };
  using NextMicroBatch = std::function<MicroBatch()>;

  // The step's bookkeeping before and after its work: counters, timers, the profiler, the
  // learning rate; then the gradients' release, the EMA and the host's lead.
  void begin_step(double lr);
  void end_step(bool ema_copies);
  // The step's work from its device inputs to the update, eager or as the CUDA graph records it:
  // `micro_batches` from `next`, each forward and backward, the gradient average, the update.
  // Returns the sum of the micro-batches' mean losses weighted by their rows.
  at::Tensor step_body(int64_t micro_batches, const NextMicroBatch& next);
  // The step of one micro-batch when a CUDA graph is kept: replayed (recorded first when due), or
  // run by step_body beside it.
  at::Tensor step_with_graph(const NextMicroBatch& next);
  // `batch` on the device, mixed as micro-batch `index` of this step.
  MicroBatch on_device(const Batch& batch, int64_t index, int64_t step_images);
  // Forward and scaled backward of a non-empty micro-batch; returns its mean loss (detached).
  at::Tensor forward_backward(const MicroBatch& micro);
  // The update from the averaged gradients: unscaled, the optimizer's step (skipped on the device
  // when they overflowed) and the loss scale's.
  void update_weights();
  // Waits for the step kStepsAhead back to end on the device (Note [The host's lead]).
  void limit_lead();
  // The batch's images and targets after MixUp or CutMix (class indices when both are off), drawn
  // for micro-batch `index` of this step.
  std::pair<at::Tensor, at::Tensor> mix(const at::Tensor& images, const at::Tensor& labels,
                                        int64_t index);
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
  std::unique_ptr<StepGraph> graph_;  // with cuda_graph on the GPU, steps of one micro-batch
  std::deque<at::cuda::CUDAEvent> steps_on_device_;  // the last steps' ends (limit_lead)
  std::unique_ptr<WeightAverage> ema_;               // with ema_decay or ema_half_life_images set
  StepTimer step_timer_;                             // where each rank's steps go, for stragglers
  int64_t step_ = 0;  // steps taken, resumed ones included (named by timeouts)
  StepProfiler profiler_;
  std::optional<StepPhase> step_phase_;  // "step N", from begin_step to end_step
};

}  // namespace trainer
