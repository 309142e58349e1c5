#include "src/distributed/gradient_reducer.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>

namespace trainer {

// Note [Bucket sizes]
// The last bucket to fill holds the parameters nearest the input, whose gradients come at the
// very end of backward: its all-reduce has nothing left to overlap with, so all of it adds to the
// step. Buckets are therefore cut starting from the input side: the input-most one is small
// (last_bucket_bytes, 1 MB: a ResNet-50's conv1, layer1 and the start of layer2), the others up to
// bucket_bytes, and the remainder lands in the first bucket to fill (the classifier's side), which
// overlaps the rest of backward. Cut the other way, from the classifier, the remainder was the last
// bucket: 16 MB of ResNet-50 (22 MB with fp16 on the wire) left exposed;
// scripts/eks/scaling_model.py has the effect on P3 and P3dn clusters (docs/BENCHMARKS.md).
std::vector<std::vector<int64_t>> GradientReducer::bucket_members(
    const std::vector<at::Tensor>& params, const ReducerOptions& options) {
  const int64_t element_bytes = c10::elementSize(options.wire_dtype);
  std::vector<std::vector<int64_t>> buckets(1);  // input side first, while cutting
  int64_t filled = 0;
  int64_t cap = std::min(options.last_bucket_bytes, options.bucket_bytes);
  for (int64_t i = 0; i < static_cast<int64_t>(params.size()); ++i) {
    const int64_t bytes = params[i].numel() * element_bytes;
    if (filled > 0 && filled + bytes > cap) {
      buckets.emplace_back();
      filled = 0;
      cap = options.bucket_bytes;
    }
    buckets.back().push_back(i);
    filled += bytes;
  }
  std::reverse(buckets.begin(), buckets.end());  // backward order: classifier side first
  for (auto& members : buckets) std::reverse(members.begin(), members.end());
  return buckets;
}

GradientReducer::GradientReducer(const std::vector<at::Tensor>& params, ProcessGroup& group,
                                 const ReducerOptions& options)
    : params_(params),
      slots_(params.size()),
      grads_are_views_(true),
      arrived_(params.size()),
      accumulated_(params.size()),
      device_(params.front().device()),
      copy_scale_(options.predivide ? 1.0 / group.size() : 1.0),
      group_(group),
      options_(options) {
  TORCH_INTERNAL_ASSERT(!params.empty());
  TORCH_CHECK(device_.is_cuda() || options.wire_dtype == at::kFloat,
              "gradient compression needs the GPU path (NCCL)");
  std::vector<int64_t> sizes;  // elements per bucket
  for (std::vector<int64_t>& members : bucket_members(params, options)) {
    buckets_.emplace_back();
    sizes.push_back(0);
    for (int64_t i : members) {
      TORCH_INTERNAL_ASSERT(params[i].is_non_overlapping_and_dense());
      slots_[i] = {static_cast<int64_t>(buckets_.size()) - 1, sizes.back()};
      sizes.back() += params[i].numel();
    }
    buckets_.back().params = std::move(members);
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].buffer = at::zeros({sizes[b]}, params.front().options().dtype(options.wire_dtype));
    if (device_.is_cuda()) {
      buckets_[b].ready.emplace(cudaEventDisableTiming);
      buckets_[b].done.emplace(cudaEventDisableTiming);
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const Slot& slot = slots_[i];
    slot_views_.push_back(buckets_[slot.bucket]
                              .buffer.narrow(0, slot.offset, params_[i].numel())
                              .as_strided(params_[i].sizes(), params_[i].strides()));
    grads_are_views_ = grads_are_views_ && params_[i].scalar_type() == options.wire_dtype;
  }
  if (device_.is_cuda())
    comm_stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device_.index());
  for (size_t i = 0; i < params_.size(); ++i)
    hook_handles_.push_back(params_[i].register_hook(
        [this, i](const at::Tensor& grad) { on_gradient(static_cast<int64_t>(i), grad); }));
}

GradientReducer::~GradientReducer() {
  for (size_t i = 0; i < params_.size(); ++i) params_[i].remove_hook(hook_handles_[i]);
}

// Note [Gradients as bucket views]
// The averaged gradient already lies in the bucket, in the parameter's shape and strides, so
// finish_step makes each .grad a view of it rather than copying it back (as DDP's
// gradient_as_bucket_view does): one copy per gradient per step (into the bucket, which the
// all-reduce needs anyway) instead of two, and no kernel per parameter after backward. This is
// what keeps the gradient path at world size one nearly free. The views must be dropped before
// the next backward: autograd adds into a defined .grad, which would count the new gradient a
// second time on top of the hook's copy. prepare_step drops them. With a compressed wire the
// bucket holds fp16/bf16, so the averages are converted into fp32 gradients instead.

void GradientReducer::prepare_step() {
  // Last step's .grad views: autograd would add into them. Note [Gradients as bucket views]
  for (at::Tensor& param : params_) param.mutable_grad().reset();
  std::fill(arrived_.begin(), arrived_.end(), false);
  std::fill(accumulated_.begin(), accumulated_.end(), false);
  accumulating_ = false;
  for (Bucket& bucket : buckets_) bucket.pending = static_cast<int64_t>(bucket.params.size());
  next_launch_ = 0;
}

// Runs in the autograd engine's thread, on the stream that produced `grad`.
void GradientReducer::on_gradient(int64_t param, const at::Tensor& grad) {
  at::NoGradGuard no_grad;
  // Pre-division happens here, in the copy's own pass: none left for the all-reduce's stream.
  if (arrived_[param] || accumulated_[param])  // a later gradient of this step: add it
    slot_views_[param].add_(grad, copy_scale_);
  else if (copy_scale_ == 1.0)
    slot_views_[param].copy_(grad);
  else
    at::mul_out(slot_views_[param], grad, copy_scale_);
  if (accumulating_) {  // an earlier micro-batch: the last one launches
    accumulated_[param] = true;
    return;
  }
  if (arrived_[param]) return;
  arrived_[param] = true;
  if (--buckets_[slots_[param].bucket].pending == 0 && comm_stream_) launch_ready_buckets();
}

// Note [Bucket order]
// Backward produces gradients roughly from the last layer to the first, but not in a fixed order
// (independent branches, such as a residual block's shortcut, may finish either way round, and
// differently on different ranks). NCCL matches collectives by the order they are issued, so a
// bucket that fills early must not overtake an earlier-numbered one: buckets are launched
// strictly in index order, each as soon as it and all before it are full. Parameters that got no
// gradient this step contribute zeros, filled in by finish_step, so no bucket waits forever.

void GradientReducer::launch_ready_buckets() {
  while (next_launch_ < bucket_count() && buckets_[next_launch_].pending == 0) {
    launch(buckets_[next_launch_], next_launch_);
    ++next_launch_;
  }
}

void GradientReducer::launch(Bucket& bucket, int64_t index) {
  const bool postdivide = !options_.predivide && group_.size() > 1;  // predivided: on_gradient
  const double scale = 1.0 / group_.size();
  if (!comm_stream_) {  // CPU: blocking MPI, timed by the group's watchdog
    group_.allreduce_sum_(bucket.buffer);
    if (postdivide) bucket.buffer.mul_(scale);
    return;
  }
  // After the gradient copies, on the stream that made them (backward's, in the autograd engine's
  // thread; the training stream, from finish_step).
  bucket.ready->record(c10::cuda::getCurrentCUDAStream(device_.index()));
  bucket.ready->block(*comm_stream_);
  c10::cuda::CUDAStreamGuard guard(*comm_stream_);
  group_.allreduce_sum_(bucket.buffer, comm_stream_->stream());
  if (postdivide) bucket.buffer.mul_(scale);
  bucket.done->record(*comm_stream_);
  // A stream being recorded into a CUDA graph has nothing to time yet: the trainer has the
  // watchdog time each replay (Note [The step graph and the watchdog]).
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(comm_stream_->stream(), &capture));
  CollectiveWatch* watchdog = group_.watchdog();
  if (watchdog && capture == cudaStreamCaptureStatusNone)
    watchdog->watch_stream("allreduce of gradient bucket " + std::to_string(index), *comm_stream_);
}

void GradientReducer::finish_step() {
  at::NoGradGuard no_grad;
  std::optional<c10::cuda::CUDAGuard> device_guard;  // current streams below are device_'s
  if (device_.is_cuda()) device_guard.emplace(device_);
  accumulating_ = false;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (arrived_[i]) continue;
    if (!accumulated_[i]) slot_views_[i].zero_();  // no gradient this step: contribute zeros
    arrived_[i] = true;
    --buckets_[slots_[i].bucket].pending;
  }
  launch_ready_buckets();
  TORCH_INTERNAL_ASSERT(next_launch_ == bucket_count(), "a bucket was never launched");
  if (comm_stream_)
    for (Bucket& bucket : buckets_)
      bucket.done->block(c10::cuda::getCurrentCUDAStream(device_.index()));
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& grad = params_[i].mutable_grad();
    if (grads_are_views_)
      grad = slot_views_[i];
    else  // compressed wire: back to the parameter's dtype
      grad = slot_views_[i].to(params_[i].scalar_type());
  }
}

}  // namespace trainer
