// The training step (Note [The training step]): Trainer::step and the parts it runs, eagerly or
// as the CUDA graph records them.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <tuple>

#include "base/seed.h"
#include "src/train/autocast.h"
#include "src/train/trainer.h"

namespace trainer {

std::pair<at::Tensor, at::Tensor> Trainer::mix(const at::Tensor& images, const at::Tensor& labels,
                                               int64_t index) {
  if (!mixing_.enabled()) return {images, labels};
  // One draw per (step, micro-batch, rank): the same again when a run resumes at this step.
  const int64_t rank = group_ ? group_->rank() : 0;
  const uint64_t seed = mix_seed(mix_seed(options_.seed ^ 0x6D69787570ULL, step_),
                                 static_cast<uint64_t>(index * options_.world_size + rank));
  const MixDraw draw = draw_mix(mixing_, seed, images.size(2), images.size(3));
  return apply_mix(draw, images, one_hot_targets(labels, options_.model.num_classes));
}

// Note [The training step]
// Trainer::step is the whole step, in the order it runs: the step's bookkeeping (begin_step),
// then step_body: each micro-batch's inputs on the device, its forward and backward; after the
// last one the gradients' average over the ranks and the update; then the gradients' release and
// the EMA (end_step). The CUDA graph records step_body itself, for a step of one micro-batch
// (Note [The step as a CUDA graph]); which steps it takes is decided in step_with_graph alone,
// once the trainer keeps a graph at all (the constructor: cuda_graph on the GPU, steps of one
// micro-batch). Its warm-up, the eager steps before a recording, is the graph's own
// (CaptureSchedule).

at::Tensor Trainer::step(const StepInputs& inputs, const std::function<Batch()>& next_batch) {
  begin_step(inputs.lr);
  int64_t rows = 0, index = 0;
  const NextMicroBatch next = [&] {
    const auto wait_start = std::chrono::steady_clock::now();
    Batch batch = next_batch();
    step_timer_.add_input_wait(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - wait_start)
            .count());
    MicroBatch micro = on_device(batch, index++, inputs.step_images);
    rows += micro.rows;
    return micro;
  };
  TORCH_INTERNAL_ASSERT(!graph_ || inputs.micro_batches == 1, "a graph steps one micro-batch");
  const at::Tensor loss_sum =
      graph_ ? step_with_graph(next) : step_body(inputs.micro_batches, next);
  end_step(inputs.ema_copies);
  return loss_sum / static_cast<double>(std::max<int64_t>(rows, 1));
}

at::Tensor Trainer::train_step(const Batch& batch, double lr, int64_t step_images) {
  StepInputs inputs;
  inputs.lr = lr;
  inputs.step_images = step_images;
  return step(inputs, [&] { return batch; });
}

void Trainer::begin_step(double lr) {
  ++step_;
  profiler_.before_step(step_);
  step_phase_.emplace("step " + std::to_string(step_));
  if (CollectiveWatch* watchdog = group_ ? group_->watchdog() : nullptr) watchdog->set_step(step_);
  step_timer_.begin();
  if (reducer_) reducer_->prepare_step();
  optimizer_->set_lr(lr);  // before the step's graph, which reads it
}

Trainer::MicroBatch Trainer::on_device(const Batch& batch, int64_t index, int64_t step_images) {
  MicroBatch micro;
  micro.rows = batch.labels.size(0);
  TORCH_INTERNAL_ASSERT(micro.rows > 0 || reducer_,
                        "an empty batch only happens with several ranks");
  // This rank's images relative to an even share of the step (1 in a full step).
  if (step_images > 0)
    micro.weight = static_cast<double>(micro.rows * options_.world_size) / step_images;
  if (micro.rows == 0) return micro;
  std::tie(micro.images, micro.targets) =
      mix(prepare_images(batch.images), batch.labels.to(device_, /*non_blocking=*/true), index);
  return micro;
}

at::Tensor Trainer::step_body(int64_t micro_batches, const NextMicroBatch& next) {
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().device(device_));
  for (int64_t i = 0; i < micro_batches; ++i) {
    const MicroBatch micro = next();
    if (reducer_) reducer_->set_accumulating(i + 1 < micro_batches);
    if (micro.rows > 0) loss_sum += forward_backward(micro) * static_cast<double>(micro.rows);
  }
  step_timer_.backward_done();
  if (reducer_) {
    const StepPhase phase("gradient all-reduce");
    reducer_->finish_step();
    step_timer_.reduced();
  }
  update_weights();
  return loss_sum;
}

at::Tensor Trainer::step_with_graph(const NextMicroBatch& next) {
  const MicroBatch micro = next();
  // The graph records full steps. With several ranks a step is full on every rank or on none (a
  // full step, or a short one dealt evenly): in the other short steps every rank runs eagerly,
  // and every rank, with images or not, takes part in make_room's decision, so that the ranks'
  // graphs stay alike.
  if (micro.weight != 1.0 || micro.rows == 0) {
    graph_->make_room(micro.images, "an eager step");
    return step_body(1, [&] { return micro; });
  }
  const int64_t replays = graph_->replays();
  at::Tensor loss_sum =
      graph_->run(micro.images, micro.targets, micro.weight,
                  [&](const at::Tensor& images, const at::Tensor& targets) {
                    return step_body(1, [&] { return MicroBatch{images, targets, micro.rows}; });
                  });
  if (graph_->replays() == replays) return loss_sum;  // an eager warm-up step
  step_timer_.replayed();                             // after the replay's update
  CollectiveWatch* watchdog = group_ ? group_->watchdog() : nullptr;
  if (reducer_ && watchdog)  // its all-reduces, in the replay
    watchdog->watch_stream("the step's CUDA graph (forward, backward, gradient all-reduce, update)",
                           c10::cuda::getCurrentCUDAStream(device_.index()));
  return loss_sum;
}

at::Tensor Trainer::forward_backward(const MicroBatch& micro) {
  at::Tensor loss;
  {
    const StepPhase phase("forward");
    AutocastGuard autocast(device_.type(), autocast_dtype_);
    at::Tensor logits = model_->forward(micro.images);  // (N, classes)
    loss = training_loss(logits.to(at::kFloat), micro.targets, loss_);
  }
  const StepPhase phase("backward");  // the gradient all-reduce's buckets start inside it
  const double weight = micro.weight * options_.grad_scale;
  scaler_.scale(weight == 1.0 ? loss : loss * weight).backward();
  return loss.detach();
}

void Trainer::update_weights() {
  // Averaged gradients: every rank unscales the same values, finds the same overflow and skips
  // the same steps, so the replicas never diverge.
  const StepPhase phase("optimizer");
  scaler_.unscale_(optimizer_->grads());
  optimizer_->step(scaler_.found_inf());
  scaler_.update();
}

void Trainer::end_step(bool ema_copies) {
  optimizer_->zero_grad();
  if (ema_) {
    const StepPhase phase("EMA");
    ema_->update(step_, ema_copies);
  }
  if (graph_) limit_lead();
  step_phase_.reset();
  profiler_.after_step(step_);
}

// Note [The host's lead]
// Eagerly a step is some 600 launches, and CUDA's launch queue keeps the host within about two
// steps of the device. Replaying a graph, a step is a few dozen, and the host could run some 30
// steps ahead: each holding its batch in pinned memory until its copy runs (38 MB at 256 images
// of 224 px), and a stop's checkpoint waiting for all of them on the device: on a slower GPU,
// seconds of the launcher's 20 s grace. So the host waits for the step kStepsAhead back
// to end: work queued long before, while the device has the steps since to run.
void Trainer::limit_lead() {
  constexpr size_t kStepsAhead = 2;
  // Blocking: the host thread sleeps rather than spin a core the decoders could use.
  steps_on_device_.emplace_back(cudaEventDisableTiming | cudaEventBlockingSync);
  steps_on_device_.back().record(c10::cuda::getCurrentCUDAStream(device_.index()));
  if (steps_on_device_.size() <= kStepsAhead) return;
  steps_on_device_.front().synchronize();
  steps_on_device_.pop_front();
}

}  // namespace trainer
