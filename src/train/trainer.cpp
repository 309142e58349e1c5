#include "src/train/trainer.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <spdlog/spdlog.h>
#include <torch/utils.h>

#include <algorithm>

#include "base/user_error.h"
#include "data/transforms/device_input.h"
#include "models/cuda/fused_batch_norm.h"
#include "src/state/weights.h"
#include "src/train/autocast.h"

namespace trainer {
namespace {

ResNet build_model(const TrainerOptions& options) {
  torch::manual_seed(options.seed);  // same initial weights for the same seed, on any device
  return ResNet(options.model);
}

// Moves 4-D weights to channels_last so cuDNN runs NHWC kernels with no layout conversions.
void to_channels_last(ResNet& model) {
  at::NoGradGuard no_grad;
  for (auto& p : model->parameters())
    if (p.dim() == 4) p.set_data(p.data().contiguous(c10::MemoryFormat::ChannelsLast));
}

// Overwrites each tensor with rank 0's (collective), on the current stream when on the GPU. The
// watchdog times the device broadcasts like the gradients' all-reduces: a rank that never joins
// (stuck in a read, say) ends the job instead of blocking the others forever. `what` names them.
void broadcast_from_rank0(const std::vector<at::Tensor>& tensors, ProcessGroup& group,
                          const std::string& what) {
  bool on_device = false;
  for (at::Tensor t : tensors) {
    on_device |= t.is_cuda();
    auto stream = t.is_cuda() ? c10::cuda::getCurrentCUDAStream().stream() : nullptr;
    group.broadcast_(t, /*root=*/0, stream);
  }
  // Host tensors went through the blocking host collective, which the watchdog already times.
  if (CollectiveWatch* watchdog = group.watchdog(); watchdog && on_device)
    watchdog->watch_stream(what, c10::cuda::getCurrentCUDAStream());
}

// Parameters as plain tensors sharing their storage (broadcast writes into them in place).
std::vector<at::Tensor> parameter_data(torch::nn::Module& module) {
  std::vector<at::Tensor> out;
  for (const auto& p : module.parameters()) out.push_back(p.data());
  return out;
}

// The parameters the optimizer updates: all, or with trainable = classifier only the classifier's
// (the others stop requiring gradients, so backward does not compute theirs).
Optimizer::NamedParameters trainable_parameters(ResNet& model, bool classifier_only) {
  Optimizer::NamedParameters out;
  for (auto& item : model->named_parameters()) {
    const bool trains = !classifier_only || is_classifier_parameter(item.key());
    item.value().set_requires_grad(trains);
    if (trains) out.emplace_back(item.key(), item.value());
  }
  return out;
}

std::vector<at::Tensor> tensors_of(const Optimizer::NamedParameters& named) {
  std::vector<at::Tensor> out;
  for (const auto& [name, tensor] : named) out.push_back(tensor);
  return out;
}

}  // namespace

bool keeps_step_graph(const TrainerOptions& options, c10::Device device) {
  // The graph records a step of one micro-batch. With accumulation its steps would run eagerly
  // beside a recording of the short step's one micro-batch, which no make_room sizes.
  return device.is_cuda() && options.cuda_graph && options.micro_batches == 1;
}

Trainer::Trainer(const TrainerOptions& options, c10::Device device, ProcessGroup* group)
    : options_(options),
      device_(device),
      autocast_dtype_(options.autocast_dtype),
      input_dtype_(autocast_dtype_.value_or(at::kFloat)),
      memory_format_(device.is_cuda() && options.channels_last ? c10::MemoryFormat::ChannelsLast
                                                               : c10::MemoryFormat::Contiguous),
      group_(group),
      model_(build_model(options)),
      scaler_(options.scaler, device),
      loss_(options.loss),
      mixing_(options.mixing),
      step_timer_(device),
      profiler_(options.profile, device, group ? group->rank() : 0) {
  model_->to(device);
  if (memory_format_ == c10::MemoryFormat::ChannelsLast) to_channels_last(model_);
  if (device.is_cuda() && autocast_dtype_ && options.model.fused_batch_norm)
    spdlog::info("batch norm in {}: {}", c10::toString(*autocast_dtype_),
                 fused_batch_norm_path(*autocast_dtype_, device.index()));
  if (device.is_cuda() && autocast_dtype_ && options.model.fused_conv_batch_norm)
    spdlog::info("bottlenecks' bn1 and bn2 inside their convolutions (cuDNN graphs, per shape)");
  if (device.is_cuda() && autocast_dtype_ && options.model.fused_residual_gradient)
    spdlog::info(
        "each block's input gradient summed in its first convolution's dgrad (cuDNN "
        "graphs, per shape)");
  if (memory_format_ == c10::MemoryFormat::ChannelsLast && options.model.compact_max_pool)
    spdlog::info("the stem's max pooling keeps a byte per output (compact_max_pool)");
  const Optimizer::NamedParameters trained = trainable_parameters(model_, options.classifier_only);
  optimizer_ = std::make_unique<Optimizer>(trained, options.optimizer);
  if (group_ && group_->launched()) {
    broadcast_from_rank0(parameter_data(*model_), *group_, "the broadcast of rank 0's weights");
    broadcast_from_rank0(model_->buffers(), *group_, "the broadcast of rank 0's BN statistics");
    reducer_ = std::make_unique<GradientReducer>(tensors_of(trained), *group_, options.reducer);
  }
  if (keeps_step_graph(options, device)) {
    StepGraphOptions graph_options;
    if (group_ && group_->size() > 1)  // the ranks release their graphs together
      graph_options.any_rank = [group = group_](bool flag) {
        return group->sum(flag, "the ranks' vote on releasing the CUDA graph") > 0;
      };
    graph_ = std::make_unique<StepGraph>(device, graph_options);
  }
  if (options.ema_decay > 0) {
    ResNet average = build_model(options);
    average->to(device);
    if (memory_format_ == c10::MemoryFormat::ChannelsLast) to_channels_last(average);
    ema_ = std::make_unique<WeightAverage>(model_, std::move(average), options.ema_decay,
                                           options.ema_every_steps, options.ema_buffers);
  }
  set_training_mode();
}

void Trainer::set_training_mode() { model_->train(!options_.classifier_only); }

at::Tensor Trainer::prepare_images(const at::Tensor& images) const {
  return normalize_images(images.to(device_, /*non_blocking=*/true), input_dtype_, memory_format_);
}

EvalResult Trainer::evaluate(BatchSource& source, bool ema, bool per_class) {
  TORCH_INTERNAL_ASSERT(!ema || ema_, "evaluate(ema) without an EMA");
  at::NoGradGuard no_grad;
  ResNet& model = ema ? ema_->model_for_evaluation() : model_;
  model->eval();
  at::Tensor top1 = at::zeros({}, at::TensorOptions().device(device_).dtype(at::kLong));
  at::Tensor top5 = top1.clone();
  // (2, classes): images and top-1 hits per class, on the device until the end.
  at::Tensor class_counts =
      per_class ? at::zeros({2, options_.model.num_classes}, top1.options()) : at::Tensor();
  int64_t images = 0;
  bool voted = false;  // on make_room: once per evaluation on every rank, batches or none
  source.start_epoch(0);
  for (int64_t b = source.batches_left(); b > 0; --b) {
    Batch batch = source.next_batch();
    at::Tensor labels = batch.labels.to(device_, /*non_blocking=*/true).unsqueeze(1);  // (N, 1)
    at::Tensor logits;
    {
      AutocastGuard autocast(device_.type(), autocast_dtype_);
      const at::Tensor images = prepare_images(batch.images);  // (N, 3, S, S)
      if (graph_ && !voted) graph_->make_room(images, "evaluation");
      voted = true;
      logits = model->forward(images);  // (N, classes)
      // The sum ranks as the mean does: FFCV's flip test-time augmentation.
      if (options_.eval_flip) logits = logits + model->forward(images.flip({3}));
    }
    const int64_t k = std::min<int64_t>(5, logits.size(1));
    at::Tensor predicted = std::get<1>(logits.topk(k, /*dim=*/1));  // (N, k), best first
    at::Tensor hits = predicted.eq(labels);                         // (N, k)
    top1 += hits.select(1, 0).sum();
    top5 += hits.any(1).sum();
    if (per_class) {
      const at::Tensor classes = labels.squeeze(1);  // (N,)
      class_counts[0].index_add_(0, classes, at::ones_like(classes));
      class_counts[1].index_add_(0, classes, hits.select(1, 0).to(at::kLong));
    }
    images += batch.labels.size(0);
  }
  if (graph_ && !voted) graph_->make_room(at::Tensor(), "evaluation");  // the others' vote
  set_training_mode();
  EvalResult result{images, top1.item<int64_t>(), top5.item<int64_t>()};
  if (group_) {
    result.images = group_->sum(result.images);
    result.top1_correct = group_->sum(result.top1_correct);
    result.top5_correct = group_->sum(result.top5_correct);
  }
  if (per_class) add_class_counts(class_counts, result);
  return result;
}

void Trainer::add_class_counts(const at::Tensor& class_counts, EvalResult& result) {
  // Summed over ranks as the counts above are, over the launcher's transport, once per evaluation.
  at::Tensor counts = class_counts.cpu().contiguous();  // (2, classes)
  if (group_) group_->allreduce_sum_(counts);
  const int64_t* data = counts.data_ptr<int64_t>();
  const int64_t classes = counts.size(1);
  result.class_images.assign(data, data + classes);
  result.class_top1_correct.assign(data + classes, data + 2 * classes);
}

void Trainer::sync_buffers() {
  if (!group_ || group_->size() == 1) return;
  broadcast_from_rank0(model_->buffers(), *group_, "the broadcast of rank 0's BN statistics");
  const std::vector<at::Tensor> averaged =
      ema_ ? ema_->rank_local_buffers() : std::vector<at::Tensor>{};
  if (!averaged.empty())
    broadcast_from_rank0(averaged, *group_, "the broadcast of rank 0's averaged BN statistics");
}

Checkpoint Trainer::checkpoint(const Progress& progress) const {
  Checkpoint out;
  out.model = state_dict(*model_);
  out.optimizer = optimizer_->state();
  if (ema_) out.ema = ema_->state();
  out.architecture = architecture();
  out.loss_scale = scaler_.scale_value();
  out.loss_scale_growth_tracker = scaler_.growth_tracker_value();
  out.progress = progress;
  out.world_size = options_.world_size;
  out.global_batch = options_.images_per_step;
  out.config = options_.resolved_config;
  out.classes = options_.classes.names;
  return out;
}

bool Trainer::load_weights(const TensorMap& weights, const std::string& source,
                           bool keep_new_classifier) {
  const bool kept = trainer::load_weights(model_, weights, source, keep_new_classifier);
  if (ema_) ema_->reset();  // the average starts from the weights the run starts from
  return kept;
}

std::string Trainer::architecture() const { return options_.architecture; }

void Trainer::restore(const Checkpoint& checkpoint) {
  USER_CHECK(checkpoint.architecture.empty() || checkpoint.architecture == architecture(),
             "the checkpoint to resume from holds a ", checkpoint.architecture,
             ", this run builds a ", architecture(),
             ". Fix: the run's arch and blurpool as they were, or resume = none");
  load_state_dict(*model_, checkpoint.model, "checkpoint");
  optimizer_->load_state(checkpoint.optimizer);
  scaler_.load(checkpoint.loss_scale, checkpoint.loss_scale_growth_tracker);
  step_ = checkpoint.progress.step;
  if (!ema_) return;
  if (!checkpoint.ema.empty()) {
    ema_->load(checkpoint.ema);
  } else {
    ema_->reset();
    spdlog::warn(
        "the checkpoint has no EMA of the weights (EMA was off): it starts from the "
        "resumed weights at step {}",
        step_);
  }
}

}  // namespace trainer
