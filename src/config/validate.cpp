// validate_config: each key's own limits (src/config/keys.def), then every relation between
// values, in groups of keys.
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "base/user_error.h"
#include "src/config/config.h"
#include "src/config/limits.h"

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

// "must be >= 1 (0: off)": a key's limits, as its error says them.
std::string must_be(const Limits& limits) {
  return "must be " + limits.rule() + (limits.note().empty() ? "" : " (" + limits.note() + ")");
}

// One key's value within its own limits. Choices, flags and lists have none: their values are
// their types'.
template <typename T>
void check_limits(const char* key, const T& value, const Limits& limits) {
  if constexpr (std::is_same_v<T, std::string>)
    check(limits.allows(value), key, "'" + value + "'", must_be(limits));
  else if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>)
    check(limits.allows(static_cast<double>(value)), key, value, must_be(limits));
  else if (!limits.is_any())
    throw std::logic_error(std::string("src/config/keys.def: ") + key + " cannot have limits");
}

// Progressive resizing (Note [Image size per epoch]), when on. The bounds are multiples of the
// step, so that every size of the ramp (rounded to the nearest multiple) lies between them;
// FFCV's figures (160 -> 192 px by 32) are.
void validate_progressive_resize(const Config& c) {
  const int64_t min = c.progressive_resize_min_size, max = c.progressive_resize_max_size;
  const int64_t step = c.progressive_resize_step;
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
  check(c.progressive_resize_end_epoch > c.progressive_resize_start_epoch,
        "progressive_resize_end_epoch", c.progressive_resize_end_epoch,
        "must be > progressive_resize_start_epoch = " +
            std::to_string(c.progressive_resize_start_epoch));
  check(c.progressive_resize_end_epoch < c.epochs, "progressive_resize_end_epoch",
        c.progressive_resize_end_epoch,
        "must be < epochs = " + std::to_string(c.epochs) +
            " (0-based: the last epoch is epochs - 1), so that training reaches the largest size");
}

// The stem, the batch and the image sizes.
void validate_sizes_and_parallelism(const Config& c) {
  check(c.stem_input_channels == 3 || !c.stem_space_to_depth, "stem_input_channels",
        c.stem_input_channels,
        "is unused with stem_space_to_depth = true (its convolution reads 16 channels of its "
        "own). Fix: stem_input_channels = 3, or stem_space_to_depth = false");
  check(c.global_batch == 0 || c.global_batch >= c.world_size, "global_batch", c.global_batch,
        "must be 0 or at least one image per rank (" + std::to_string(c.world_size) +
            " ranks). Fix: a global_batch of at least the number of GPUs, or fewer ranks");
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
  }
  // The synthetic and generated sources hand out ready tensors: nothing would be augmented.
  check(c.data_source == DataSource::kTfrecord ||
            (c.auto_augment == AutoAugmentPolicy::kNone && c.random_erasing == 0),
        "data_source", name_of(c.data_source),
        "does not augment: auto_augment and random_erasing need data_source = tfrecord "
        "(or set auto_augment = none and random_erasing = 0)");
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
    check(c.val_resize >= c.eval_image_size(), "val_resize", c.val_resize,
          "must be >= the evaluation crop (val_image_size, else image_size) = " +
              std::to_string(c.eval_image_size()) +
              ": the centre crop is taken from the resized image");
  }
}

// The EMA's two ways of saying its decay, and what needs one.
void validate_ema(const Config& c) {
  check(c.ema_decay == 0 || c.ema_half_life_images == 0, "ema_half_life_images",
        c.ema_half_life_images, "and ema_decay set the same thing: set one of them, the other 0");
  const bool ema_on = c.ema_decay > 0 || c.ema_half_life_images > 0;
  const std::string needs_ema = "needs an EMA: set ema_decay or ema_half_life_images";
  check(ema_on || !c.ema_warmup_reset, "ema_warmup_reset", "true", needs_ema);
  check(ema_on || c.ema_buffers == EmaBuffers::kCopy, "ema_buffers", name_of(c.ema_buffers),
        needs_ema);
}

// The optimizer and the LR schedule.
void validate_optimizer_and_schedule(const Config& c) {
  check(!c.nesterov || c.momentum > 0, "nesterov", c.nesterov, "needs momentum > 0");
  check(c.warmup_epochs < c.epochs, "warmup_epochs", c.warmup_epochs,
        "must be shorter than training (epochs = " + std::to_string(c.epochs) + ")");
  if (c.lr_schedule == LrScheduleKind::kStep) {
    check(!c.lr_step_epochs.empty(), "lr_step_epochs", "[]", "step schedule needs epochs");
    for (size_t i = 0; i < c.lr_step_epochs.size(); ++i)
      check(c.lr_step_epochs[i] > 0 && c.lr_step_epochs[i] < c.epochs &&
                (i == 0 || c.lr_step_epochs[i] > c.lr_step_epochs[i - 1]),
            "lr_step_epochs", c.lr_step_epochs[i], "must be increasing, each in (0, epochs)");
  }
}

// Evaluation, checkpoints, logs, and the modes that exclude each other.
void validate_run_modes(const Config& c) {
  check(c.target_top1 == 0 || c.data_source == DataSource::kGenerated ||
            (c.data_source == DataSource::kTfrecord && !c.val_data.empty()),
        "target_top1", c.target_top1,
        "needs held-out data to evaluate: data_source = tfrecord with val_data (or generated)");
  check(!(c.benchmark && c.data_source != DataSource::kSynthetic), "benchmark", c.benchmark,
        "needs data_source = synthetic");
  check(!(c.evaluate_only && c.data_source == DataSource::kSynthetic), "evaluate_only",
        c.evaluate_only,
        "needs held-out data: data_source = tfrecord with val_data (or generated)");
  check(!(c.evaluate_only && c.benchmark), "evaluate_only", c.evaluate_only,
        "and benchmark = true exclude each other");
}

}  // namespace

void validate_keys(const Config& c) {
  using namespace limits;
#define CONFIG_KEY(group, type, name, default_value, key_limits, help) \
  check_limits(#name, c.name, key_limits);
#include "src/config/keys.def"
#undef CONFIG_KEY
}

void validate_config(const Config& c) {
  validate_keys(c);
  validate_sizes_and_parallelism(c);
  validate_generated_data_and_augmentation(c);
  validate_tfrecord_input(c);
  validate_ema(c);
  validate_optimizer_and_schedule(c);
  validate_run_modes(c);
}

}  // namespace trainer
