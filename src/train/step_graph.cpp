#include "src/train/step_graph.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "base/user_error.h"

namespace trainer {

// What the graph records and what stays eager: Note [The step as a CUDA graph].

StepShape StepShape::of(const at::Tensor& images, const at::Tensor& targets, double weight) {
  return {images.sizes().vec(), targets.sizes().vec(), images.scalar_type(), targets.scalar_type(),
          weight};
}

bool StepShape::operator==(const StepShape& other) const {
  return images == other.images && targets == other.targets && images_dtype == other.images_dtype &&
         targets_dtype == other.targets_dtype && weight == other.weight;
}

// Note [Steps around and beside the graph]
// - Eager around it: the input's copy and normalisation, MixUp/CutMix (drawn on the host), the
//   learning rate's write, the EMA.
// - Eager instead of it: every step of a shape seen fewer than `warmup_steps` times in a row (a
//   short last step, the first steps at a new image size) and, with several ranks, every short
//   step where the ranks' shares differ (Trainer::step_with_graph). With micro-batch
//   accumulation the trainer keeps no graph (a benchmark steps one batch at a time and keeps it):
//   its steps would run eagerly beside a recording of the short step's one micro-batch, which no
//   make_room sizes.
// - The host keeps within two steps of the device (Trainer::limit_lead, Note [The host's lead]).
// Capture follows warm-up steps of the same shape, which leave cuDNN's autotuning cached and the
// libraries' per-stream workspaces made, on a side stream as CUDA requires (never the default
// stream). Memory: Note [The step graph's memory].

CaptureSchedule::Action CaptureSchedule::next(const StepShape& shape) {
  if (recorded_ && *recorded_ == shape) {
    warming_.reset();  // a shape warms up in a row: an epoch's short step, once each, never does
    return Action::kReplay;
  }
  if (warming_ && *warming_ == shape) {
    ++warm_steps_;
  } else {
    warming_ = shape;
    warm_steps_ = 1;
  }
  const bool warmed_before = released_ && *released_ == shape;
  if (warm_steps_ <= warmup_steps_ && !warmed_before) return Action::kEager;
  recorded_ = shape;
  released_.reset();
  return Action::kCapture;
}

void CaptureSchedule::release() {
  if (recorded_) released_ = recorded_;
  recorded_.reset();
}

// Note [The step graph's memory]
// The graph's pool keeps the step's activations between steps, and an eager step allocates its
// own beside it (a 16 GB V100 holds the shipped 256 images of 224 px in fp16 once, by estimate,
// not twice). So:
// - Before capture, the allocator's cache goes back to the device: the warm-up steps'
//   activations, cached by the allocator but free, would otherwise sit beside the graph's.
// - One graph is kept: a new shape's capture frees the last one's pool, so progressive resizing
//   holds one step's activations at a time.
// - An eager step beside the graph (an epoch's short last step, the first steps at a new size)
//   runs there only when the device's free memory holds it by estimate (eager_step_bytes); if
//   not, the graph is released first and recorded again, without warm-up, at the next step of
//   its shape: on a tight card once an epoch, where a card with room keeps it. Evaluation asks
//   the same with its first batch, an estimate well above what its forward passes take.
// - With several ranks the decision is the ranks' (a sum of their wants of room): each graph
//   holds the gradient all-reduce, and NCCL requires collectives in graphs to be recorded and
//   replayed alike on every rank, so one rank cannot release and record again alone. Every rank
//   asks at the same points (the trainer runs a short step eagerly on all of them, and a rank with
//   no images or no evaluation batch still votes).

int64_t eager_step_bytes(int64_t graph_bytes, int64_t step_image_elements,
                         int64_t recorded_image_elements, double margin) {
  const double scaled = static_cast<double>(graph_bytes) *
                        static_cast<double>(step_image_elements) /
                        static_cast<double>(recorded_image_elements);
  const double bytes = std::ceil(scaled * margin);
  // An endless margin (no eager step beside the graph) and 0 x infinity alike: more than any card.
  return bytes < 9.2e18 ? static_cast<int64_t>(bytes) : std::numeric_limits<int64_t>::max();
}

StepGraph::StepGraph(c10::Device device, StepGraphOptions options)
    : device_(device),
      side_stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index())),
      memory_margin_(options.memory_margin),
      any_rank_(std::move(options.any_rank)),
      schedule_(options.warmup_steps) {
  TORCH_INTERNAL_ASSERT(device.is_cuda(), "a CUDA graph needs a CUDA device");
}

StepGraph::~StepGraph() = default;

at::Tensor StepGraph::run(const at::Tensor& images, const at::Tensor& targets, double weight,
                          const Body& body) {
  switch (schedule_.next(StepShape::of(images, targets, weight))) {
    case CaptureSchedule::Action::kEager:
      make_room(images, "an eager step");
      return run_eager(images, targets, body);
    case CaptureSchedule::Action::kCapture:
      capture(images, targets, body);
      return replay(images, targets);
    case CaptureSchedule::Action::kReplay:
      return replay(images, targets);
  }
  TORCH_INTERNAL_ASSERT(false, "unreachable");
}

namespace {

// Orders `then` after all `first` has queued. Ordered both ways around each side-stream section,
// tensors made on either stream are safe to use and free on the other.
void order_after(const c10::cuda::CUDAStream& first, const c10::cuda::CUDAStream& then) {
  at::cuda::CUDAEvent event;
  event.record(first);
  event.block(then);
}

// The device's free memory as the driver counts it.
int64_t device_free_bytes(c10::DeviceIndex device) {
  return static_cast<int64_t>(c10::cuda::CUDACachingAllocator::get()->getMemoryInfo(device).first);
}

// What an eager step could allocate: the device's free memory once the allocator has given back
// what it caches (after a device synchronisation), and no more than its cap leaves, if capped
// (gpu_memory_gib).
int64_t free_device_memory(c10::DeviceIndex device) {
  namespace allocator = c10::cuda::CUDACachingAllocator;
  allocator::emptyCache();
  int64_t available = device_free_bytes(device);
  const double fraction = allocator::getMemoryFraction(device);  // of the card's whole memory
  if (fraction < 1.0) {
    const auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    const int64_t reserved = allocator::getDeviceStats(device).reserved_bytes[aggregate].current;
    const double card = static_cast<double>(at::cuda::getDeviceProperties(device)->totalGlobalMem);
    available = std::min(available, static_cast<int64_t>(fraction * card) - reserved);
  }
  return std::max<int64_t>(available, 0);
}

// A recording that failed, with what failed (without LibTorch's backtrace) and the fix.
UserError capture_error(const std::exception& error) {
  const auto* torch_error = dynamic_cast<const c10::Error*>(&error);
  return UserError(
      detail::concat("the training step could not be recorded as a CUDA graph: ",
                     torch_error ? torch_error->what_without_backtrace() : error.what(),
                     "\nFix: cuda_graph = false (the step runs eagerly, as before)"));
}

// Ends a capture whose step threw, and the allocations into its pool, and says what threw.
[[noreturn]] void abandon_capture(at::cuda::CUDAGraph& graph, const std::exception& error) {
  try {
    graph.capture_end();
  } catch (const std::exception&) {  // the capture was invalidated: nothing to keep
  }
  throw capture_error(error);
}

}  // namespace

bool graph_must_go(int64_t needed, int64_t free, const std::function<bool(bool)>& any_rank) {
  const bool short_here = needed > free;
  return any_rank ? any_rank(short_here) : short_here;
}

void StepGraph::make_room(const at::Tensor& images, const char* what) {
  if (!graph_) return;  // as on every rank: they record at the same steps
  int64_t needed = 0, free = 0;
  if (images.defined()) {
    needed = eager_step_bytes(graph_bytes_, images.numel(), static_images_.numel(), memory_margin_);
    free = free_device_memory(device_.index());
  }
  if (!graph_must_go(needed, free, any_rank_)) return;
  if (needed > free)
    spdlog::info(
        "the step's CUDA graph ({} MiB) released for {} on images {}, which may need up to {} "
        "MiB with {} MiB free; recorded again at the next step of images {}",
        graph_bytes_ >> 20, what, c10::str(images.sizes()), needed >> 20, free >> 20,
        c10::str(static_images_.sizes()));
  else
    spdlog::info(
        "the step's CUDA graph ({} MiB) released for {}: another rank has no room beside its "
        "own, and the ranks' graphs hold their all-reduces alike; recorded again at the next "
        "step of images {}",
        graph_bytes_ >> 20, what, c10::str(static_images_.sizes()));
  free_graph();
  schedule_.release();
  ++releases_;
}

void StepGraph::free_graph() {
  static_loss_ = at::Tensor();
  static_images_ = at::Tensor();
  static_targets_ = at::Tensor();
  graph_.reset();
}

at::Tensor StepGraph::run_eager(const at::Tensor& images, const at::Tensor& targets,
                                const Body& body) {
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device_.index());
  order_after(current, side_stream_);
  at::Tensor loss;
  {
    const c10::cuda::CUDAStreamGuard guard(side_stream_);
    loss = body(images, targets);
  }
  order_after(side_stream_, current);
  return loss;
}

// Note [The step as a CUDA graph]
// A ResNet-50 step launches some 600 kernels, and at a small per-GPU batch (what a fixed global
// batch gives on many GPUs) the host launching them takes longer than the GPU running them. A
// CUDA graph records the launches once and replays them with one call, as MLPerf's ResNet-50 and
// PyTorch's whole-network capture do. What it records:
// - Recorded: the eager step's own body (Trainer::step_body, Note [The training step]): forward,
//   loss, the scaled backward, the gradient buckets' copies and all-reduces (NCCL records into
//   graphs), the gradients' unscaling and overflow check, the optimizer's fused update and the
//   loss scale's, as MLPerf's step does. Host code in there runs only while
//   capturing: the gradient hooks, the buckets' bookkeeping, the optimizer's choice of
//   parameters. The graph reads its inputs from static buffers, which each step fills, and the
//   learning rate from a device tensor the step writes first (Optimizer::set_lr); the weights,
//   momentum buffers and loss scale it updates in place. The gradients are the graph's own: the
//   parameters' .grad go back to none after the step, as after an eager one.
// What stays eager: Note [Steps around and beside the graph].

// Note [The step graph and the watchdog]
// Capture is thread-local: the collective watchdog goes on querying the events of earlier steps
// from its own thread, and the gradient reducer does not ask it to watch a stream being captured
// (a captured event cannot be queried); the trainer has it watch each replay instead.

void StepGraph::capture(const at::Tensor& images, const at::Tensor& targets, const Body& body) {
  free_graph();  // the last shape's, and the memory it holds
  // The warm-up steps' cached activations back to the device, and the driver's count before, so
  // that the recording's own size is measured (the cap, if any, does not enter the difference).
  c10::cuda::CUDACachingAllocator::emptyCache();
  const int64_t free_before = device_free_bytes(device_.index());
  static_images_ = images.clone();  // the same layout (channels_last stays)
  static_targets_ = targets.clone();
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device_.index());
  order_after(current, side_stream_);
  auto graph = std::make_unique<at::cuda::CUDAGraph>();
  {
    const c10::cuda::CUDAStreamGuard guard(side_stream_);
    graph->capture_begin(/*pool=*/{0, 0}, cudaStreamCaptureModeThreadLocal);
    try {
      static_loss_ = body(static_images_, static_targets_);
    } catch (const std::exception& e) {
      abandon_capture(*graph, e);
    }
    try {
      graph->capture_end();
    } catch (const std::exception& e) {  // the step did what a capture cannot hold
      throw capture_error(e);
    }
  }
  order_after(side_stream_, current);
  graph_ = std::move(graph);
  ++captures_;
  graph_bytes_ = std::max<int64_t>(free_before - device_free_bytes(device_.index()), 0);
  spdlog::info("training step recorded as a CUDA graph: images {}, targets {}, {} MiB",
               c10::str(images.sizes()), c10::str(targets.sizes()), graph_bytes_ >> 20);
}

at::Tensor StepGraph::replay(const at::Tensor& images, const at::Tensor& targets) {
  TORCH_INTERNAL_ASSERT(graph_, "a replay without a recorded step");
  static_images_.copy_(images, /*non_blocking=*/true);
  static_targets_.copy_(targets, /*non_blocking=*/true);
  graph_->replay();
  ++replays_;
  return static_loss_.clone();  // the next replay overwrites static_loss_
}

}  // namespace trainer
