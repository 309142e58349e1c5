// validate_config: every value and every relation between values, in groups of keys.
#include <cmath>
#include <sstream>
#include <string>
#include <utility>

#include "base/user_error.h"
#include "src/config.h"

namespace trainer {
namespace {

// Throws "config key 'KEY' = VALUE: RULE" unless `ok`.
template <typename T>
void check(bool ok, const std::string& key, const T& value, const std::string& rule) {
  if (ok) return;
  std::ostringstream out;
  out << "config key '" << key << "' = " << value << " is invalid: " << rule;
  throw UserError(out.str());
}

// Progressive resizing (Note [Image size per epoch]), when on. The bounds are multiples of the
// step, so that every size of the ramp (rounded to the nearest multiple) lies between them;
// FFCV's figures (160 -> 192 px by 32) are.
void validate_progressive_resize(const Config& c) {
  const int64_t min = c.progressive_resize_min_size, max = c.progressive_resize_max_size;
  const int64_t step = c.progressive_resize_step;
  check(step >= 1, "progressive_resize_step", step, "must be >= 1 pixel (FFCV: 32)");
  if (!c.progressive_resize()) return;
  check(min > 0 && max > 0, min > 0 ? "progressive_resize_max_size" : "progressive_resize_min_size",
        min > 0 ? max : min,
        "must be > 0 with the other one set: set both (e.g. 160 and 192), or both to 0 (off)");
  check(min >= 32, "progressive_resize_min_size", min,
        "must be >= 32 (ResNet downsamples 32x), e.g. 160");
  check(min <= max, "progressive_resize_max_size", max,
        "must be >= progressive_resize_min_size = " + std::to_string(min));
  for (const auto& [key, size] : {std::pair{"progressive_resize_min_size", min},
                                  std::pair{"progressive_resize_max_size", max}})
    check(size % step == 0, key, size,
          "must be a multiple of progressive_resize_step = " + std::to_string(step) +
              ": the sizes between are rounded to multiples of it. Fix: round it, or set the "
              "step to a divisor of both sizes");
  check(c.progressive_resize_start_epoch >= 0, "progressive_resize_start_epoch",
        c.progressive_resize_start_epoch, "must be >= 0 (epochs count from 0, as FFCV's)");
  check(c.progressive_resize_end_epoch > c.progressive_resize_start_epoch,
        "progressive_resize_end_epoch", c.progressive_resize_end_epoch,
        "must be > progressive_resize_start_epoch = " +
            std::to_string(c.progressive_resize_start_epoch));
  check(c.progressive_resize_end_epoch < c.epochs, "progressive_resize_end_epoch",
        c.progressive_resize_end_epoch,
        "must be < epochs = " + std::to_string(c.epochs) +
            " (0-based: the last epoch is epochs - 1), so that training reaches the largest size");
}

// The model, the batch and the image sizes, and the gradient all-reduce.
void validate_sizes_and_parallelism(const Config& c) {
  check(c.bucket_mb > 0 && c.bucket_mb <= 1024, "bucket_mb", c.bucket_mb, "must be in [1, 1024]");
  check(c.collective_timeout_s > 0, "collective_timeout_s", c.collective_timeout_s,
        "must be > 0 seconds");
  check(std::isfinite(c.gpu_memory_gib) && c.gpu_memory_gib >= 0, "gpu_memory_gib",
        c.gpu_memory_gib, "must be >= 0 GiB (0: the whole card)");
  check(c.stem_input_channels == 3 || c.stem_input_channels == 4 || c.stem_input_channels == 8,
        "stem_input_channels", c.stem_input_channels,
        "must be 3 (the image's channels), 4 or 8 (the image and zero channels)");
  check(c.stem_input_channels == 3 || !c.stem_space_to_depth, "stem_input_channels",
        c.stem_input_channels,
        "is unused with stem_space_to_depth = true (its convolution reads 16 channels of its "
        "own). Fix: stem_input_channels = 3, or stem_space_to_depth = false");
  check(c.global_batch == 0 || c.global_batch >= c.world_size, "global_batch", c.global_batch,
        "must be 0 or at least one image per rank (" + std::to_string(c.world_size) +
            " ranks). Fix: a global_batch of at least the number of GPUs, or fewer ranks");
  check(c.num_classes > 0, "num_classes", c.num_classes, "must be > 0");
  check(c.batch_size > 0, "batch_size", c.batch_size, "must be > 0 (images per GPU)");
  check(c.image_size >= 32, "image_size", c.image_size, "must be >= 32 (ResNet downsamples 32x)");
  check(c.val_image_size == 0 || c.val_image_size >= 32, "val_image_size", c.val_image_size,
        "must be 0 (image_size) or >= 32 (ResNet downsamples 32x)");
  validate_progressive_resize(c);
  // A rank may train a single image (batch_size 1, or its share of an epoch's short last step);
  // below 64 pixels its last feature map is 1x1, and batch norm cannot train on one value.
  const std::string why =
      ": batch norm needs more than one value per channel, and ResNet's last feature map is 1x1 "
      "below 64 pixels (or raise the crop to 64)";
  if (c.micro_batch_size() < c.batch_size)  // shrunk to fit global_batch
    check(c.micro_batch_size() > 1 || c.smallest_train_image_size() >= 64, "global_batch",
          c.global_batch,
          "leaves 1 image per rank on " + std::to_string(c.world_size) +
              " ranks, and a training crop < 64 (image_size, or progressive_resize_min_size) "
              "needs >= 2" +
              why);
  else
    check(c.batch_size > 1 || c.smallest_train_image_size() >= 64, "batch_size", c.batch_size,
          "with a training crop < 64 (image_size, or progressive_resize_min_size) must be >= 2" +
              why);
  check(c.synthetic_batches_per_epoch > 0, "synthetic_batches_per_epoch",
        c.synthetic_batches_per_epoch, "must be > 0");
}

// The generated source, and the augmentation of training crops.
void validate_generated_data_and_augmentation(const Config& c) {
  if (c.data_source == DataSource::kGenerated) {
    check(c.generated_classes >= 2 && c.generated_classes <= c.num_classes, "generated_classes",
          c.generated_classes, "must be in [2, num_classes]");
    check(c.generated_train_images >= c.images_per_micro_batch(), "generated_train_images",
          c.generated_train_images,
          "must hold at least one micro-batch of every rank (" +
              std::to_string(c.images_per_micro_batch()) + ")");
    check(c.generated_val_images > 0, "generated_val_images", c.generated_val_images,
          "must be > 0");
  }
  // Data: TFRecord input pipeline.
  check(c.randaugment_num_ops >= 1 && c.randaugment_num_ops <= 16, "randaugment_num_ops",
        c.randaugment_num_ops, "must be in [1, 16] (torchvision's default is 2)");
  check(c.randaugment_magnitude >= 0 && c.randaugment_magnitude <= 30, "randaugment_magnitude",
        c.randaugment_magnitude, "must be in [0, 30]: a bin of RandAugment's 31 (default 9)");
  check(c.random_erasing >= 0 && c.random_erasing <= 1, "random_erasing", c.random_erasing,
        "must be a probability in [0, 1]");
  // The synthetic and generated sources hand out ready tensors: nothing would be augmented.
  check(c.data_source == DataSource::kTfrecord ||
            (c.auto_augment == AutoAugmentPolicy::kNone && c.random_erasing == 0),
        "data_source", name_of(c.data_source),
        "does not augment: auto_augment and random_erasing need data_source = tfrecord "
        "(or set auto_augment = none and random_erasing = 0)");
  check(c.repeated_augmentation >= 1 && c.repeated_augmentation <= 16, "repeated_augmentation",
        c.repeated_augmentation, "must be in [1, 16]: copies of each image (1: off)");
  check(c.data_source == DataSource::kTfrecord || c.repeated_augmentation == 1,
        "repeated_augmentation", c.repeated_augmentation,
        "needs data_source = tfrecord (or set repeated_augmentation = 1)");
  check(c.data_source == DataSource::kTfrecord || c.train_crop == TrainCrop::kRandomResized,
        "data_source", name_of(c.data_source),
        "has no records' boxes: train_crop = distorted_bounding_box needs data_source = tfrecord "
        "(or set train_crop = random_resized)");
  check(c.data_source == DataSource::kTfrecord || c.epoch_order == EpochOrder::kGlobal,
        "epoch_order", name_of(c.epoch_order),
        "keeps each node's TFRecord files in its page cache: it needs data_source = tfrecord "
        "(or set epoch_order = global)");
}

// The TFRecord input pipeline.
void validate_tfrecord_input(const Config& c) {
  if (c.data_source == DataSource::kTfrecord) {
    if (c.evaluate_only)  // reads the validation files alone
      check(!c.val_data.empty(), "val_data", "''",
            "evaluate_only needs the validation files, e.g. /fsx/imagenet/validation-*");
    else
      check(!c.train_data.empty(), "train_data", "''",
            "data_source = tfrecord needs the training files, e.g. /fsx/imagenet/train-*");
    check(c.label_offset >= -1, "label_offset", c.label_offset,
          "must be >= 0, or -1: the record layout's (tensorflow 1, tfds 0)");
    check(c.max_bad_fraction >= 0 && c.max_bad_fraction <= 1, "max_bad_fraction",
          c.max_bad_fraction, "must be in [0, 1]");
    check(c.reader_threads >= 1 && c.reader_threads <= 64, "reader_threads", c.reader_threads,
          "must be in [1, 64]");
    check(c.decode_threads >= 0 && c.decode_threads <= 1024, "decode_threads", c.decode_threads,
          "must be in [0, 1024] (0: cores / local ranks)");
    check(c.prefetch_batches >= 1, "prefetch_batches", c.prefetch_batches, "must be >= 1");
    check(c.shuffle_buffer >= 0, "shuffle_buffer", c.shuffle_buffer, "must be >= 0");
    check(c.val_resize >= c.eval_image_size(), "val_resize", c.val_resize,
          "must be >= the evaluation crop (val_image_size, else image_size) = " +
              std::to_string(c.eval_image_size()) +
              ": the centre crop is taken from the resized image");
  }
}

// Training length, loss, MixUp/CutMix and the EMA.
void validate_training_length_and_loss(const Config& c) {
  check(c.epochs > 0, "epochs", c.epochs, "must be > 0");
  check(c.max_steps >= 0, "max_steps", c.max_steps, "must be >= 0 (0: run all epochs)");
  check(c.label_smoothing >= 0 && c.label_smoothing < 1, "label_smoothing", c.label_smoothing,
        "must be in [0, 1)");
  check(c.mixup_alpha >= 0 && std::isfinite(c.mixup_alpha), "mixup_alpha", c.mixup_alpha,
        "must be >= 0 (0: off)");
  check(c.cutmix_alpha >= 0 && std::isfinite(c.cutmix_alpha), "cutmix_alpha", c.cutmix_alpha,
        "must be >= 0 (0: off)");
  check(c.ema_decay >= 0 && c.ema_decay < 1, "ema_decay", c.ema_decay,
        "must be in [0, 1) (0: off), e.g. 0.9999");
  check(c.ema_half_life_images >= 0 && std::isfinite(c.ema_half_life_images),
        "ema_half_life_images", c.ema_half_life_images, "must be >= 0 (0: off)");
  check(c.ema_decay == 0 || c.ema_half_life_images == 0, "ema_half_life_images",
        c.ema_half_life_images, "and ema_decay set the same thing: set one of them, the other 0");
  check(c.ema_every_steps >= 1, "ema_every_steps", c.ema_every_steps, "must be >= 1");
  const bool ema_on = c.ema_decay > 0 || c.ema_half_life_images > 0;
  const std::string needs_ema = "needs an EMA: set ema_decay or ema_half_life_images";
  check(ema_on || !c.ema_warmup_reset, "ema_warmup_reset", "true", needs_ema);
  check(ema_on || c.ema_buffers == EmaBuffers::kCopy, "ema_buffers", name_of(c.ema_buffers),
        needs_ema);
}

// The optimizer, the LR schedule and loss scaling.
void validate_optimizer_and_schedule(const Config& c) {
  check(c.base_lr > 0 && std::isfinite(c.base_lr), "base_lr", c.base_lr, "must be > 0");
  check(c.momentum >= 0 && c.momentum < 1, "momentum", c.momentum, "must be in [0, 1)");
  check(!c.nesterov || c.momentum > 0, "nesterov", c.nesterov, "needs momentum > 0");
  check(c.weight_decay >= 0, "weight_decay", c.weight_decay, "must be >= 0");
  check(c.lars_eta > 0, "lars_eta", c.lars_eta, "must be > 0");
  check(c.grad_scale > 0, "grad_scale", c.grad_scale,
        "must be > 0 (1: the mean gradient; 2: the MLPerf reference's summed 1024 x 2)");
  check(c.warmup_epochs >= 0 && c.warmup_epochs < c.epochs, "warmup_epochs", c.warmup_epochs,
        "must be >= 0 and shorter than training (epochs = " + std::to_string(c.epochs) + ")");
  if (c.lr_schedule == LrScheduleKind::kStep) {
    check(!c.lr_step_epochs.empty(), "lr_step_epochs", "[]", "step schedule needs epochs");
    for (size_t i = 0; i < c.lr_step_epochs.size(); ++i)
      check(c.lr_step_epochs[i] > 0 && c.lr_step_epochs[i] < c.epochs &&
                (i == 0 || c.lr_step_epochs[i] > c.lr_step_epochs[i - 1]),
            "lr_step_epochs", c.lr_step_epochs[i], "must be increasing, each in (0, epochs)");
    check(c.lr_step_gamma > 0 && c.lr_step_gamma < 1, "lr_step_gamma", c.lr_step_gamma,
          "must be in (0, 1)");
  }
  check(c.lr_poly_power > 0, "lr_poly_power", c.lr_poly_power, "must be > 0");
  check(c.loss_scale_init >= 1, "loss_scale_init", c.loss_scale_init, "must be >= 1");
  check(c.loss_scale_growth_interval > 0, "loss_scale_growth_interval",
        c.loss_scale_growth_interval, "must be > 0");
}

// Evaluation, checkpoints, logs, and the modes that exclude each other.
void validate_run_modes(const Config& c) {
  check(c.eval_every_epochs >= 0, "eval_every_epochs", c.eval_every_epochs, "must be >= 0");
  check(c.target_top1 >= 0 && c.target_top1 <= 100, "target_top1", c.target_top1,
        "must be a top-1 percentage in (0, 100], or 0 (off)");
  check(c.target_top1 == 0 || c.data_source == DataSource::kGenerated ||
            (c.data_source == DataSource::kTfrecord && !c.val_data.empty()),
        "target_top1", c.target_top1,
        "needs held-out data to evaluate: data_source = tfrecord with val_data (or generated)");
  check(c.checkpoint_every_steps >= 0, "checkpoint_every_steps", c.checkpoint_every_steps,
        "must be >= 0");
  check(c.keep_checkpoints >= 1, "keep_checkpoints", c.keep_checkpoints, "must be >= 1");
  check(!c.resume.empty(), "resume", "''", "use auto, none or a checkpoint path");
  check(c.log_every_steps > 0, "log_every_steps", c.log_every_steps, "must be > 0");
  check(c.profile_steps >= 0, "profile_steps", c.profile_steps, "must be >= 0 (0: none)");
  check(c.profile_first_step >= 1, "profile_first_step", c.profile_first_step,
        "must be >= 1 (steps count from 1)");
  check(!c.output_dir.empty(), "output_dir", "''", "must name a directory");
  check(c.benchmark_warmup_steps >= 0, "benchmark_warmup_steps", c.benchmark_warmup_steps,
        "must be >= 0");
  check(c.benchmark_steps > 0, "benchmark_steps", c.benchmark_steps, "must be > 0");
  check(!(c.benchmark && c.data_source != DataSource::kSynthetic), "benchmark", c.benchmark,
        "needs data_source = synthetic");
  check(!(c.evaluate_only && c.data_source == DataSource::kSynthetic), "evaluate_only",
        c.evaluate_only,
        "needs held-out data: data_source = tfrecord with val_data (or generated)");
  check(!(c.evaluate_only && c.benchmark), "evaluate_only", c.evaluate_only,
        "and benchmark = true exclude each other");
}

}  // namespace

void validate_config(const Config& c) {
  validate_sizes_and_parallelism(c);
  validate_generated_data_and_augmentation(c);
  validate_tfrecord_input(c);
  validate_training_length_and_loss(c);
  validate_optimizer_and_schedule(c);
  validate_run_modes(c);
}

}  // namespace trainer
