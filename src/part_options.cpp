#include "src/part_options.h"

#include <filesystem>

#include "base/user_error.h"
#include "src/sources.h"
#include "src/train/weight_average.h"

namespace trainer {
namespace {

int resnet_depth(Arch arch) {
  switch (arch) {
    case Arch::kResNet18:
      return 18;
    case Arch::kResNet34:
      return 34;
    case Arch::kResNet50:
      return 50;
    case Arch::kResNet101:
      return 101;
    case Arch::kResNet152:
      return 152;
  }
  TORCH_INTERNAL_ASSERT(false, "no depth for arch ", static_cast<int>(arch));
}

std::optional<at::ScalarType> autocast_dtype(Precision precision) {
  if (precision == Precision::kFp16) return at::kHalf;
  if (precision == Precision::kBf16) return at::kBFloat16;
  return std::nullopt;
}

ReducerOptions reducer_options(const Config& c) {
  ReducerOptions options;
  options.bucket_bytes = c.bucket_mb << 20;
  options.predivide = c.grad_average == GradAverage::kPre;
  options.wire_dtype = c.grad_compression == GradCompression::kFp16   ? at::kHalf
                       : c.grad_compression == GradCompression::kBf16 ? at::kBFloat16
                                                                      : at::kFloat;
  return options;
}

// The EMA's decay per update: ema_decay, or the one that gives ema_half_life_images at this run's
// images per step (recomputed at each start, so a resize keeps the half-life in images); 0: off.
double ema_decay_per_update(const Config& c) {
  if (c.ema_decay > 0) return c.ema_decay;
  if (c.ema_half_life_images <= 0) return 0;
  return decay_for_half_life(c.ema_half_life_images,
                             static_cast<double>(c.images_per_step() * c.ema_every_steps));
}

}  // namespace

TrainerOptions trainer_options(const Config& c) {
  TrainerOptions o;
  o.model = ResNetOptions{resnet_depth(c.arch), c.num_classes, c.zero_init_residual,
                          c.blurpool,           c.weight_init, c.fused_batch_norm};
  o.architecture = name_of(c.arch) + (c.blurpool ? "-blurpool" : "");
  o.seed = c.seed;
  o.autocast_dtype = autocast_dtype(c.precision);
  o.channels_last = c.channels_last;
  o.cuda_graph = c.cuda_graph;
  // A benchmark's steps are one batch each, whatever global_batch says (run_benchmark).
  o.micro_batches = c.benchmark ? 1 : c.micro_batches();
  o.model.stem_input_channels = c.stem_input_channels;
  o.model.stem_space_to_depth = c.stem_space_to_depth;
  o.model.fused_conv_batch_norm = c.fused_conv_batch_norm;
  o.model.fused_residual_gradient = c.fused_residual_gradient;
  o.model.compact_max_pool = c.compact_max_pool;
  o.classifier_only = c.trainable == Trainable::kClassifier;
  o.optimizer = {c.optimizer,    c.momentum,          c.nesterov,
                 c.weight_decay, c.decay_bn_and_bias, c.lars_eta};
  o.reducer = reducer_options(c);
  o.scaler.enabled = c.precision == Precision::kFp16;
  o.scaler.init_scale = c.loss_scale_init;
  o.scaler.growth_interval = c.loss_scale_growth_interval;
  o.loss = {c.loss, c.label_smoothing};
  o.grad_scale = c.grad_scale;
  o.mixing = {c.mixup_alpha, c.cutmix_alpha};
  o.ema_decay = ema_decay_per_update(c);
  o.eval_flip = c.eval_flip;
  o.profile = {c.profile_first_step, c.profile_steps,
               (std::filesystem::path(c.output_dir) / "profile").string()};
  o.ema_every_steps = c.ema_every_steps;
  o.ema_buffers = c.ema_buffers;
  o.world_size = c.world_size;
  o.images_per_step = c.images_per_step();
  o.resolved_config = config_to_toml(c);
  return o;
}

LrScheduleOptions lr_schedule_options(const Config& c) {
  LrScheduleOptions o;
  o.kind = c.lr_schedule;
  o.base_lr = c.base_lr;
  o.images_per_step = c.images_per_step();
  o.warmup_epochs = c.warmup_epochs;
  o.epochs = c.epochs;
  o.step_epochs = c.lr_step_epochs;
  o.step_gamma = c.lr_step_gamma;
  o.poly_power = c.lr_poly_power;
  return o;
}

IntervalLogOptions interval_log_options(const Config& c) { return {c.epochs}; }

BenchmarkOptions benchmark_options(const Config& c) {
  return {c.benchmark_warmup_steps, c.benchmark_steps, c.micro_batch_size(),
          lr_schedule_options(c)};
}

StartOptions start_options(const Config& c) {
  StartOptions o;
  o.checkpoint_dir = std::filesystem::path(c.output_dir) / "checkpoints";
  o.resume = c.resume;
  o.init_weights = c.init_weights;
  o.elastic = c.elastic;
  o.restart_count = c.restart_count;
  o.blurpool = c.blurpool;
  o.num_classes = c.num_classes;
  o.classifier_only = c.trainable == Trainable::kClassifier;
  o.keep_checkpoints = c.keep_checkpoints;
  o.world_size = c.world_size;
  o.images_per_step = c.images_per_step();
  o.base_lr = c.base_lr;
  return o;
}

FitOptions fit_options(const Config& c) {
  FitOptions o;
  o.epochs = c.epochs;
  o.max_steps = c.max_steps;
  o.images_per_step = c.images_per_step();
  o.images_per_micro_batch = c.images_per_micro_batch();
  o.whole_steps_of = c.whole_steps_of();
  o.log_every_steps = c.log_every_steps;
  o.eval_every_epochs = c.eval_every_epochs;
  o.checkpoint_every_steps = c.checkpoint_every_steps;
  o.target_top1 = c.target_top1;
  o.ema_warmup_reset = c.ema_warmup_reset;
  o.ema_every_steps = c.ema_every_steps;
  o.check_data_order = c.check_data_order;
  o.num_classes = c.num_classes;
  o.world_size = c.world_size;
  o.by_node = c.epoch_order == EpochOrder::kByNode;
  o.image_size = c.image_size;
  o.image_sizes = progressive_image_sizes(c);
  o.schedule = lr_schedule_options(c);
  o.interval = interval_log_options(c);
  o.start = start_options(c);
  return o;
}

}  // namespace trainer
