// The training step's forward, backward, gradient all-reduce and update as one CUDA graph: some
// 600 kernel launches (and the all-reduce's) replayed by one call, so that a step at a small
// per-GPU batch is no longer bound by the host launching kernels (Note [The step as a CUDA graph]).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/Device.h>
#include <c10/cuda/CUDAStream.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace trainer {

// What a recorded step depends on besides its inputs' values: their shapes and dtypes, and the
// loss weight (a constant in the recording).
struct StepShape {
  std::vector<int64_t> images, targets;
  at::ScalarType images_dtype, targets_dtype;
  double weight;
  static StepShape of(const at::Tensor& images, const at::Tensor& targets, double weight);
  bool operator==(const StepShape& other) const;
};

// When a step is recorded: after `warmup_steps` eager steps of one shape in a row. A recorded
// shape replays; any other runs eagerly, and a new shape that lasts is recorded in place of the
// old one (progressive resizing), while a shape seen once (a short last step) is not. A recording
// released to make room for an eager step is made again when its shape next comes, without
// another warm-up.
class CaptureSchedule {
 public:
  enum class Action { kEager, kCapture, kReplay };
  explicit CaptureSchedule(int64_t warmup_steps) : warmup_steps_(warmup_steps) {}
  Action next(const StepShape& shape);  // what to do with a step of `shape`, counting it
  void release();                       // forgets the recorded shape: its graph is gone

 private:
  int64_t warmup_steps_;
  std::optional<StepShape> warming_;  // the shape of the last eager steps
  int64_t warm_steps_ = 0;            // eager steps of `warming_` in a row
  std::optional<StepShape> recorded_;
  std::optional<StepShape> released_;  // warmed up already: recorded again at once
};

// The device memory an eager step takes beside a recorded one, by estimate: what recording took
// (`graph_bytes`: activations, gradients, workspaces), scaled by the step's image elements over
// the recorded step's (activations grow with batch x height x width), times `margin` for what
// does not scale and the allocator's rounding.
int64_t eager_step_bytes(int64_t graph_bytes, int64_t step_image_elements,
                         int64_t recorded_image_elements, double margin);

// Whether the graph goes to make room for work beside it: when `needed` bytes do not fit in `free`
// here or, asked with `any_rank` (StepGraphOptions), on another rank.
bool graph_must_go(int64_t needed, int64_t free, const std::function<bool(bool)>& any_rank);

struct StepGraphOptions {
  // Eager steps of one input shape before it is recorded (cuDNN's autotuning, the libraries'
  // per-stream workspaces).
  int64_t warmup_steps = 3;
  // eager_step_bytes' margin: an eager step runs beside the graph only when its estimate fits in
  // the device's free memory; otherwise the graph is released first.
  double memory_margin = 1.25;
  // With several ranks: whether any rank's flag is true, a collective every rank calls in the same
  // order. Each rank's graph records the gradient all-reduce, and NCCL requires the ranks to
  // record and replay their collectives alike, so one rank's want of room releases every rank's
  // graph. Empty: this rank decides alone.
  std::function<bool(bool)> any_rank;
};

class StepGraph {
 public:
  // The step's work on prepared inputs: forward, scaled backward, gradients averaged, the weights
  // updated in place; returns the mean loss (0-dim, device). Run eagerly, or captured: what it
  // writes besides the loss must be tensors that outlive the graph (weights, optimizer and loss
  // scaler state), which a replay writes again, and what it reads besides the inputs (the
  // learning rate) tensors the caller writes before each step.
  using Body = std::function<at::Tensor(const at::Tensor& images, const at::Tensor& targets)>;

  explicit StepGraph(c10::Device device, StepGraphOptions options = {});
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // One step of `body` on `images` and `targets` (device tensors), on the current stream: by
  // replaying the graph captured for their shapes, by capturing it, or eagerly while a shape
  // warms up or is seen only once (releasing the graph first when the step would not fit beside
  // it). `weight` (the step's loss weight) is part of what was captured. Returns the mean loss, a
  // tensor of its own.
  at::Tensor run(const at::Tensor& images, const at::Tensor& targets, double weight,
                 const Body& body);

  int64_t replays() const { return replays_; }  // steps run by replaying a graph
  int64_t captures() const { return captures_; }
  int64_t releases() const { return releases_; }  // graphs released to make room

  // Releases the graph when work on `images` beside it (`what`: an eager step, evaluation, whose
  // forward passes take less) would not fit in the device's free memory by estimate
  // (eager_step_bytes), here or, with `any_rank`, on another rank; the graph is recorded again
  // at the next step of its shape. With `any_rank` every rank calls it at the same points: one
  // with no work there (an empty share of a short step, no evaluation batch) with `images`
  // undefined.
  void make_room(const at::Tensor& images, const char* what);

 private:
  void free_graph();  // the graph, its static tensors and its memory pool
  at::Tensor run_eager(const at::Tensor& images, const at::Tensor& targets, const Body& body);
  void capture(const at::Tensor& images, const at::Tensor& targets, const Body& body);
  at::Tensor replay(const at::Tensor& images, const at::Tensor& targets);

  c10::Device device_;
  c10::cuda::CUDAStream side_stream_;  // warm-up and capture: never the default stream
  double memory_margin_;
  std::function<bool(bool)> any_rank_;
  CaptureSchedule schedule_;
  // The captured step. Members below the graph are destroyed first: its memory pool outlives
  // the tensors it holds.
  std::unique_ptr<at::cuda::CUDAGraph> graph_;
  at::Tensor static_images_, static_targets_;  // what the graph reads
  at::Tensor static_loss_;                     // what it writes
  int64_t graph_bytes_ = 0;                    // device memory the recording took
  int64_t replays_ = 0;
  int64_t captures_ = 0;
  int64_t releases_ = 0;
};

}  // namespace trainer
