#include "src/dist/gradient_reducer.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>

namespace trainer {

// Note [Bucket order]
// Backward produces gradients roughly from the last layer to the first, but not in a fixed order
// (independent branches, such as a residual block's shortcut, may finish either way round, and
// differently on different ranks). NCCL matches collectives by the order they are issued, so a
// bucket that fills early must not overtake an earlier-numbered one: buckets are launched
// strictly in index order, each as soon as it and all before it are full. Parameters that got no
// gradient this step contribute zeros, filled in by finish_step, so no bucket waits forever.

GradientReducer::GradientReducer(const std::vector<at::Tensor>& params, ProcessGroup& group,
                                 const ReducerOptions& options)
    : params_(params),
      slots_(params.size()),
      arrived_(params.size()),
      group_(group),
      options_(options) {
  TORCH_INTERNAL_ASSERT(!params.empty());
  const c10::Device device = params.front().device();
  TORCH_CHECK(device.is_cuda() || options.wire_dtype == at::kFloat,
              "gradient compression needs the GPU path (NCCL)");
  const int64_t element_bytes = c10::elementSize(options.wire_dtype);
  std::vector<int64_t> sizes;  // elements per bucket
  for (int64_t i = static_cast<int64_t>(params.size()) - 1; i >= 0; --i) {
    TORCH_INTERNAL_ASSERT(params[i].is_non_overlapping_and_dense());
    if (buckets_.empty() || sizes.back() * element_bytes >= options.bucket_bytes) {
      buckets_.emplace_back();
      sizes.push_back(0);
    }
    slots_[i] = {static_cast<int64_t>(buckets_.size()) - 1, sizes.back()};
    buckets_.back().params.push_back(i);
    sizes.back() += params[i].numel();
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].buffer = at::zeros({sizes[b]}, params.front().options().dtype(options.wire_dtype));
    if (device.is_cuda()) {
      buckets_[b].ready.emplace(cudaEventDisableTiming);
      buckets_[b].done.emplace(cudaEventDisableTiming);
    }
  }
  if (device.is_cuda())
    comm_stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device.index());
  for (size_t i = 0; i < params_.size(); ++i)
    hook_handles_.push_back(params_[i].register_hook(
        [this, i](const at::Tensor& grad) { on_gradient(static_cast<int64_t>(i), grad); }));
}

GradientReducer::~GradientReducer() {
  for (size_t i = 0; i < params_.size(); ++i) params_[i].remove_hook(hook_handles_[i]);
}

at::Tensor GradientReducer::slot_view(int64_t param) {
  const at::Tensor& p = params_[param];
  const Slot& slot = slots_[param];
  return buckets_[slot.bucket]
      .buffer.narrow(0, slot.offset, p.numel())
      .as_strided(p.sizes(), p.strides());
}

void GradientReducer::prepare_step() {
  std::fill(arrived_.begin(), arrived_.end(), false);
  for (Bucket& bucket : buckets_) {
    bucket.pending = static_cast<int64_t>(bucket.params.size());
    bucket.launched = false;
  }
  next_launch_ = 0;
}

// Runs in the autograd engine's thread, on the stream that produced `grad`.
void GradientReducer::on_gradient(int64_t param, const at::Tensor& grad) {
  at::NoGradGuard no_grad;
  if (arrived_[param]) {  // a second gradient for the same parameter: accumulate
    slot_view(param).add_(grad);
    return;
  }
  slot_view(param).copy_(grad);
  arrived_[param] = true;
  if (--buckets_[slots_[param].bucket].pending == 0 && comm_stream_) launch_ready_buckets();
}

void GradientReducer::launch_ready_buckets() {
  while (next_launch_ < bucket_count() && buckets_[next_launch_].pending == 0) {
    launch(buckets_[next_launch_], next_launch_);
    ++next_launch_;
  }
}

void GradientReducer::launch(Bucket& bucket, int64_t index) {
  const double scale = 1.0 / group_.size();
  const std::string what = "allreduce of gradient bucket " + std::to_string(index);
  if (!comm_stream_) {  // CPU: MPI, blocking
    if (options_.predivide) bucket.buffer.mul_(scale);
    if (watchdog_) watchdog_->begin_host(what);
    group_.allreduce_sum_(bucket.buffer);
    if (watchdog_) watchdog_->end_host();
    if (!options_.predivide) bucket.buffer.mul_(scale);
    bucket.launched = true;
    return;
  }
  bucket.ready->record();  // on the current (compute) stream, after the gradient copies
  bucket.ready->block(*comm_stream_);
  c10::cuda::CUDAStreamGuard guard(*comm_stream_);
  if (options_.predivide) bucket.buffer.mul_(scale);
  group_.allreduce_sum_(bucket.buffer, comm_stream_->stream());
  if (!options_.predivide) bucket.buffer.mul_(scale);
  bucket.done->record(*comm_stream_);
  bucket.launched = true;
  if (watchdog_) watchdog_->watch_event(what, &*bucket.done);
}

void GradientReducer::finish_step() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (arrived_[i]) continue;  // no gradient this step: contribute zeros
    slot_view(static_cast<int64_t>(i)).zero_();
    arrived_[i] = true;
    --buckets_[slots_[i].bucket].pending;
  }
  launch_ready_buckets();
  TORCH_INTERNAL_ASSERT(next_launch_ == bucket_count(), "a bucket was never launched");
  if (comm_stream_)
    for (Bucket& bucket : buckets_) bucket.done->block(c10::cuda::getCurrentCUDAStream());
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor averaged = slot_view(static_cast<int64_t>(i));
    at::Tensor& grad = params_[i].mutable_grad();
    if (grad.defined())
      grad.copy_(averaged);
    else
      grad = averaged.to(params_[i].scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  }
}

}  // namespace trainer
