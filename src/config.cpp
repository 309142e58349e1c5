#include "src/config.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <type_traits>

#include "base/check.h"

namespace trainer {
namespace {

const std::vector<std::string> kArchs = {"resnet18", "resnet34", "resnet50", "resnet101",
                                         "resnet152"};
const std::vector<std::string> kDevices = {"auto", "cuda", "cpu"};
const std::vector<std::string> kPrecisions = {"fp32", "fp16", "bf16"};
const std::vector<std::string> kDataSources = {"synthetic", "generated", "tfrecord"};
const std::vector<std::string> kBadRecordPolicies = {"skip", "fail"};
const std::vector<std::string> kOptimizers = {"sgd", "lars"};
const std::vector<std::string> kSchedules = {"cosine", "step", "poly"};
const std::vector<std::string> kGradAverage = {"pre", "post"};
const std::vector<std::string> kCompression = {"none", "fp16", "bf16"};
const std::vector<std::string> kTrainable = {"all", "classifier"};
const std::vector<std::string> kLosses = {"cross_entropy", "bce"};

// A double as --help and config.toml show it: as iostreams print it (6 significant digits) where
// that reads back as the same value, else the shortest text that does (3.0517578125e-05, not
// 3.05176e-05), so that the resolved config.toml reproduces every value exactly.
std::string exact_text(double value) {
  std::ostringstream out;
  out << value;
  if (std::strtod(out.str().c_str(), nullptr) == value) return out.str();
  char text[32];
  return std::string(text, std::to_chars(text, text + sizeof text, value).ptr);
}
const std::vector<std::string> kAutoAugment = {"none", "trivialaugment_wide", "randaugment",
                                               "autoaugment_imagenet"};

// Binds every key of `c` to an option whose default is its current value, grouped for --help.
void add_options(CLI::App& app, Config& c) {
  auto add = [&](const char* group, const char* key, auto& field, const char* help) {
    CLI::Option* option = app.add_option(std::string("--") + key, field, help);
    if constexpr (std::is_floating_point_v<std::decay_t<decltype(field)>>)
      option->default_function([&field] { return exact_text(field); });
    option->capture_default_str()->group(group);
    // A key given twice (file, then command line; or twice on the command line): the last wins.
    if constexpr (!std::is_same_v<std::decay_t<decltype(field)>, std::vector<int64_t>>)
      option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  };
  add("Output", "output_dir", c.output_dir, "checkpoints, metrics.jsonl and config.toml");
  add("Output", "tensorboard", c.tensorboard, "TensorBoard event files in output_dir/tensorboard");
  add("Model", "arch", c.arch, "resnet18 | resnet34 | resnet50 | resnet101 | resnet152");
  add("Model", "num_classes", c.num_classes, "classifier width");
  add("Model", "zero_init_residual", c.zero_init_residual, "zero each block's last BN gamma");
  add("Model", "init_weights", c.init_weights,
      "start from these weights: state dict or checkpoint file; \"\": none");
  add("Model", "trainable", c.trainable, "all | classifier (linear probe)");
  add("Model", "blurpool", c.blurpool, "blur before each strided convolution (anti-aliasing)");
  add("Device", "device", c.device, "auto | cuda | cpu");
  add("Device", "precision", c.precision, "fp32 | fp16 (loss scaling) | bf16");
  add("Device", "channels_last", c.channels_last, "NHWC activations on the GPU");
  add("Device", "cudnn_benchmark", c.cudnn_benchmark, "cuDNN algorithm autotuning");
  add("Data", "data_source", c.data_source, "synthetic | generated | tfrecord");
  add("Data", "batch_size", c.batch_size, "images per GPU and step");
  add("Data", "image_size", c.image_size, "training crop, pixels (unless progressive resizing)");
  add("Data", "val_image_size", c.val_image_size, "evaluation centre crop, pixels; 0: image_size");
  add("Data", "synthetic_batches_per_epoch", c.synthetic_batches_per_epoch, "synthetic epoch");
  add("Data", "generated_classes", c.generated_classes, "generated source: classes");
  add("Data", "generated_train_images", c.generated_train_images, "generated: training images");
  add("Data", "generated_val_images", c.generated_val_images, "generated: held-out images");
  // Data: TFRecord input pipeline.
  add("Data", "train_data", c.train_data, "tfrecord: training files, glob or directory");
  add("Data", "val_data", c.val_data, "tfrecord: validation files, glob or directory");
  add("Data", "label_offset", c.label_offset, "tfrecord: subtracted from labels (1; 0 keeps)");
  add("Data", "bad_record_policy", c.bad_record_policy, "tfrecord: skip | fail");
  add("Data", "max_bad_fraction", c.max_bad_fraction, "tfrecord: skip at most this fraction");
  add("Data", "reader_threads", c.reader_threads, "tfrecord: file reader threads per rank");
  add("Data", "decode_threads", c.decode_threads, "tfrecord: decode threads; 0: cores/ranks");
  add("Data", "prefetch_batches", c.prefetch_batches, "tfrecord: batches decoded ahead");
  add("Data", "shuffle_buffer", c.shuffle_buffer, "tfrecord: shuffle buffer, records");
  add("Data", "index_cache_dir", c.index_cache_dir, "tfrecord: index files for read-only data");
  add("Data", "val_resize", c.val_resize, "tfrecord: eval shorter side before centre crop");
  add("Augmentation", "auto_augment", c.auto_augment,
      "tfrecord training: none | trivialaugment_wide | randaugment | autoaugment_imagenet");
  add("Augmentation", "randaugment_num_ops", c.randaugment_num_ops,
      "randaugment: ops per image, 1-16");
  add("Augmentation", "randaugment_magnitude", c.randaugment_magnitude,
      "randaugment: magnitude bin of 31, 0-30");
  add("Augmentation", "random_erasing", c.random_erasing,
      "tfrecord training: probability of erasing a rectangle, 0-1");
  add("Augmentation", "mixup_alpha", c.mixup_alpha, "MixUp's Beta(alpha, alpha); 0: off");
  add("Augmentation", "cutmix_alpha", c.cutmix_alpha, "CutMix's Beta(alpha, alpha); 0: off");
  add("Progressive resizing", "progressive_resize_min_size", c.progressive_resize_min_size,
      "training crop up to start_epoch, pixels; min = max = 0: off (image_size)");
  add("Progressive resizing", "progressive_resize_max_size", c.progressive_resize_max_size,
      "training crop from end_epoch on, pixels");
  add("Progressive resizing", "progressive_resize_start_epoch", c.progressive_resize_start_epoch,
      "last epoch at min_size, 0-based (FFCV's start_ramp)");
  add("Progressive resizing", "progressive_resize_end_epoch", c.progressive_resize_end_epoch,
      "first epoch at max_size, 0-based (FFCV's end_ramp), < epochs");
  add("Progressive resizing", "progressive_resize_step", c.progressive_resize_step,
      "sizes between: the ramp rounded to a multiple of this");
  add("Training", "epochs", c.epochs, "training epochs");
  add("Training", "max_steps", c.max_steps, "stop after this many steps; 0: all epochs");
  add("Training", "seed", c.seed, "initialisation and shuffling seed");
  add("Training", "label_smoothing", c.label_smoothing, "in [0, 1)");
  add("Training", "loss", c.loss, "cross_entropy | bce (binary cross-entropy per class)");
  add("EMA", "ema_decay", c.ema_decay, "EMA of the weights: decay per update; 0: off");
  add("EMA", "ema_half_life_images", c.ema_half_life_images,
      "or: images after which a weight's share halves; 0: off");
  add("EMA", "ema_every_steps", c.ema_every_steps, "steps between EMA updates");
  add("Optimizer", "optimizer", c.optimizer, "sgd | lars");
  add("Optimizer", "base_lr", c.base_lr, "LR per 256 images (linear scaling rule)");
  add("Optimizer", "momentum", c.momentum, "in [0, 1)");
  add("Optimizer", "nesterov", c.nesterov, "Nesterov momentum");
  add("Optimizer", "weight_decay", c.weight_decay, ">= 0");
  add("Optimizer", "decay_bn_and_bias", c.decay_bn_and_bias, "decay (and LARS-scale) BN/bias");
  add("Optimizer", "lars_eta", c.lars_eta, "LARS trust coefficient");
  add("Schedule", "lr_schedule", c.lr_schedule, "cosine | step | poly");
  add("Schedule", "warmup_epochs", c.warmup_epochs, "linear warmup length, < epochs");
  add("Schedule", "lr_step_epochs", c.lr_step_epochs, "step: increasing epochs < epochs");
  add("Schedule", "lr_step_gamma", c.lr_step_gamma, "step: LR multiplier in (0, 1)");
  add("Schedule", "lr_poly_power", c.lr_poly_power, "poly: power > 0");
  add("Loss scaling", "loss_scale_init", c.loss_scale_init, "fp16: initial loss scale");
  add("Loss scaling", "loss_scale_growth_interval", c.loss_scale_growth_interval,
      "fp16: clean steps before the scale doubles");
  add("Data parallel", "bucket_mb", c.bucket_mb,
      "gradient bucket size cap, MB (the input-most bucket: 1 MB)");
  add("Data parallel", "grad_average", c.grad_average, "pre | post: divide before/after the sum");
  add("Data parallel", "grad_compression", c.grad_compression, "none | fp16 | bf16 on the wire");
  add("Data parallel", "collective_timeout_s", c.collective_timeout_s,
      "end the job when a collective hangs this long");
  add("Data parallel", "global_batch", c.global_batch,
      "images per step at any world size (accumulation); 0: batch_size x ranks");
  add("Checkpoints", "eval_every_epochs", c.eval_every_epochs, "0: only at the end");
  add("Checkpoints", "checkpoint_every_steps", c.checkpoint_every_steps, "0: every epoch end");
  add("Checkpoints", "keep_checkpoints", c.keep_checkpoints, "newest K kept");
  add("Checkpoints", "resume", c.resume, "auto | none | checkpoint path");
  add("Checkpoints", "evaluate_only", c.evaluate_only,
      "evaluate init_weights (else resume's checkpoint) and exit");
  add("Checkpoints", "log_every_steps", c.log_every_steps, "log and metrics interval");
  add("Benchmark", "benchmark", c.benchmark, "synthetic-data throughput run");
  add("Benchmark", "benchmark_warmup_steps", c.benchmark_warmup_steps, "untimed steps");
  add("Benchmark", "benchmark_steps", c.benchmark_steps, "timed steps");
}

std::string join(const std::vector<std::string>& values) {
  std::string out;
  for (const auto& v : values) out += (out.empty() ? "" : ", ") + v;
  return out;
}

void check_member(const std::string& key, const std::string& value,
                  const std::vector<std::string>& allowed) {
  for (const auto& a : allowed)
    if (value == a) return;
  throw UserError("config key '" + key + "' = '" + value +
                  "' is not allowed; use one of: " + join(allowed));
}

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

}  // namespace

void validate_config(const Config& c) {
  check_member("arch", c.arch, kArchs);
  check_member("device", c.device, kDevices);
  check_member("precision", c.precision, kPrecisions);
  check_member("data_source", c.data_source, kDataSources);
  check_member("optimizer", c.optimizer, kOptimizers);
  check_member("lr_schedule", c.lr_schedule, kSchedules);
  check_member("grad_average", c.grad_average, kGradAverage);
  check_member("grad_compression", c.grad_compression, kCompression);
  check_member("trainable", c.trainable, kTrainable);
  check(c.bucket_mb > 0 && c.bucket_mb <= 1024, "bucket_mb", c.bucket_mb, "must be in [1, 1024]");
  check(c.collective_timeout_s > 0, "collective_timeout_s", c.collective_timeout_s,
        "must be > 0 seconds");
  check(c.global_batch == 0 || c.global_batch >= c.images_per_micro_batch(), "global_batch",
        c.global_batch,
        "must be 0 or at least batch_size x ranks = " + std::to_string(c.images_per_micro_batch()) +
            ": lower batch_size (images per GPU per micro-batch)");
  check(c.num_classes > 0, "num_classes", c.num_classes, "must be > 0");
  check(c.batch_size > 0, "batch_size", c.batch_size, "must be > 0 (images per GPU)");
  check(c.image_size >= 32, "image_size", c.image_size, "must be >= 32 (ResNet downsamples 32x)");
  check(c.val_image_size == 0 || c.val_image_size >= 32, "val_image_size", c.val_image_size,
        "must be 0 (image_size) or >= 32 (ResNet downsamples 32x)");
  validate_progressive_resize(c);
  // A rank may train a single image (batch_size 1, or its share of an epoch's short last step);
  // below 64 pixels its last feature map is 1x1, and batch norm cannot train on one value.
  check(c.batch_size > 1 || c.smallest_train_image_size() >= 64, "batch_size", c.batch_size,
        "with a training crop < 64 (image_size, or progressive_resize_min_size) must be >= 2: "
        "batch norm needs more than one value per channel, and ResNet's last feature map is 1x1 "
        "below 64 pixels (or raise the crop to 64)");
  check(c.synthetic_batches_per_epoch > 0, "synthetic_batches_per_epoch",
        c.synthetic_batches_per_epoch, "must be > 0");
  if (c.data_source == "generated") {
    check(c.generated_classes >= 2 && c.generated_classes <= c.num_classes, "generated_classes",
          c.generated_classes, "must be in [2, num_classes]");
    check(c.generated_train_images >= c.images_per_micro_batch(), "generated_train_images",
          c.generated_train_images, "must hold at least one global batch (batch_size x ranks)");
    check(c.generated_val_images > 0, "generated_val_images", c.generated_val_images,
          "must be > 0");
  }
  // Data: TFRecord input pipeline.
  check_member("bad_record_policy", c.bad_record_policy, kBadRecordPolicies);
  check_member("auto_augment", c.auto_augment, kAutoAugment);
  check(c.randaugment_num_ops >= 1 && c.randaugment_num_ops <= 16, "randaugment_num_ops",
        c.randaugment_num_ops, "must be in [1, 16] (torchvision's default is 2)");
  check(c.randaugment_magnitude >= 0 && c.randaugment_magnitude <= 30, "randaugment_magnitude",
        c.randaugment_magnitude, "must be in [0, 30]: a bin of RandAugment's 31 (default 9)");
  check(c.random_erasing >= 0 && c.random_erasing <= 1, "random_erasing", c.random_erasing,
        "must be a probability in [0, 1]");
  // The synthetic and generated sources hand out ready tensors: nothing would be augmented.
  check(c.data_source == "tfrecord" || (c.auto_augment == "none" && c.random_erasing == 0),
        "data_source", c.data_source,
        "does not augment: auto_augment and random_erasing need data_source = tfrecord "
        "(or set auto_augment = none and random_erasing = 0)");
  if (c.data_source == "tfrecord") {
    if (c.evaluate_only)  // reads the validation files alone
      check(!c.val_data.empty(), "val_data", "''",
            "evaluate_only needs the validation files, e.g. /fsx/imagenet/validation-*");
    else
      check(!c.train_data.empty(), "train_data", "''",
            "data_source = tfrecord needs the training files, e.g. /fsx/imagenet/train-*");
    check(c.label_offset >= 0, "label_offset", c.label_offset, "must be >= 0");
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
  check(c.epochs > 0, "epochs", c.epochs, "must be > 0");
  check(c.max_steps >= 0, "max_steps", c.max_steps, "must be >= 0 (0: run all epochs)");
  check(c.label_smoothing >= 0 && c.label_smoothing < 1, "label_smoothing", c.label_smoothing,
        "must be in [0, 1)");
  check_member("loss", c.loss, kLosses);
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
  check(c.base_lr > 0 && std::isfinite(c.base_lr), "base_lr", c.base_lr, "must be > 0");
  check(c.momentum >= 0 && c.momentum < 1, "momentum", c.momentum, "must be in [0, 1)");
  check(!c.nesterov || c.momentum > 0, "nesterov", c.nesterov, "needs momentum > 0");
  check(c.weight_decay >= 0, "weight_decay", c.weight_decay, "must be >= 0");
  check(c.lars_eta > 0, "lars_eta", c.lars_eta, "must be > 0");
  check(c.warmup_epochs >= 0 && c.warmup_epochs < c.epochs, "warmup_epochs", c.warmup_epochs,
        "must be >= 0 and shorter than training (epochs = " + std::to_string(c.epochs) + ")");
  if (c.lr_schedule == "step") {
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
  check(c.eval_every_epochs >= 0, "eval_every_epochs", c.eval_every_epochs, "must be >= 0");
  check(c.checkpoint_every_steps >= 0, "checkpoint_every_steps", c.checkpoint_every_steps,
        "must be >= 0");
  check(c.keep_checkpoints >= 1, "keep_checkpoints", c.keep_checkpoints, "must be >= 1");
  check(!c.resume.empty(), "resume", "''", "use auto, none or a checkpoint path");
  check(c.log_every_steps > 0, "log_every_steps", c.log_every_steps, "must be > 0");
  check(!c.output_dir.empty(), "output_dir", "''", "must name a directory");
  check(c.benchmark_warmup_steps >= 0, "benchmark_warmup_steps", c.benchmark_warmup_steps,
        "must be >= 0");
  check(c.benchmark_steps > 0, "benchmark_steps", c.benchmark_steps, "must be > 0");
  check(!(c.benchmark && c.data_source != "synthetic"), "benchmark", c.benchmark,
        "needs data_source = synthetic");
  check(!(c.evaluate_only && c.data_source == "synthetic"), "evaluate_only", c.evaluate_only,
        "needs held-out data: data_source = tfrecord with val_data (or generated)");
  check(!(c.evaluate_only && c.benchmark), "evaluate_only", c.evaluate_only,
        "and benchmark = true exclude each other");
}

// Edits (insert, delete, substitute) between two keys, to suggest the key a typo meant.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// Options of `train` that are not configuration keys.
bool is_command(const std::string& name) {
  return name == "help" || name == "config" || name == "help_markdown";
}

bool is_key(const CLI::App& app, const std::string& name) {
  return !is_command(name) && app.get_option_no_throw("--" + name) != nullptr;
}

// " (did you mean 'batch_size'?)" when a key is within a few edits of `name`; else "".
// `prefix` is how the key is written where the typo was: "" in the file, "--" on the command line.
std::string did_you_mean(const CLI::App& app, const std::string& name, const std::string& prefix) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, name.size() / 4) + 1;
  for (const CLI::Option* option : app.get_options())
    for (const std::string& key : option->get_lnames()) {
      if (is_command(key)) continue;
      const size_t distance = edit_distance(name, key);
      if (distance < best_distance) best = key, best_distance = distance;
    }
  return best.empty() ? "" : " (did you mean " + prefix + best + "?)";
}

// What is wrong in the --config file at `path` that CLI11 refused: a table (the file is flat),
// or the first key no option has. CLI11's own message ("INI was not able to parse ...") names
// neither the file nor the fix.
std::string config_file_problem(const CLI::App& app, const std::string& path) {
  std::ifstream in(path);
  for (const CLI::ConfigItem& item : CLI::ConfigTOML().from_config(in)) {
    if (!item.parents.empty())
      return "config file " + path + " has a [" + item.parents.front() +
             "] table; keys go at the top level, outside any [section]";
    if (!is_key(app, item.name))
      return "config file " + path + ": '" + item.name + "' is not a key" +
             did_you_mean(app, item.name, "");
  }
  return "";
}

// The first unknown option among the command-line words CLI11 did not take.
std::string unknown_argument_problem(const CLI::App& app, const std::vector<std::string>& words) {
  for (const std::string& word : words)
    if (word.rfind("--", 0) == 0) {
      const std::string name = word.substr(2, word.find('=') - 2);
      return "unknown option --" + name + did_you_mean(app, name, "--");
    }
  const std::string& word = words.front();
  if (word.find('/') != std::string::npos)  // most likely an unquoted glob the shell expanded
    return "unexpected argument '" + word +
           "': quote a glob so the shell passes it whole, e.g. --train_data "
           "'/fsx/imagenet/train-*'";
  return "unexpected argument '" + word + "' (every setting is --key value)";
}

std::optional<Config> parse_config(int argc, const char* const argv[]) {
  Config config;
  CLI::App app{
      "Trains ResNet on one GPU, the CPU, or many GPUs under mpirun.\n"
      "Every key can be set in the --config file (key = value) and overridden as --key."};
  app.set_config("--config", "", "TOML file of `key = value` lines");
  app.allow_config_extras(CLI::config_extras_mode::error);
  app.allow_extras();  // unknown command-line options: reported below, with a suggestion
  add_options(app, config);
  bool markdown = false;
  app.add_flag("--help_markdown", markdown, "every key as Markdown tables (docs/configuration.md)");
  const std::string hint = ". Run `train --help` for every key and its values.";
  try {
    app.parse(argc, argv);
    if (markdown) {
      std::cout << config_reference_markdown();
      return std::nullopt;
    }
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return std::nullopt;
  } catch (const CLI::ConfigError& e) {
    const CLI::Option* file = app["--config"];
    const std::string problem =
        file->count() > 0 ? config_file_problem(app, file->as<std::string>()) : "";
    throw UserError((problem.empty() ? std::string(e.what()) : problem) + hint);
  } catch (const CLI::ParseError& e) {
    throw UserError(std::string(e.what()) + hint);
  }
  if (!app.remaining().empty())
    throw UserError(unknown_argument_problem(app, app.remaining()) + hint);
  validate_config(config);
  return config;
}

// TOML value of one option from its default string (the resolved value, see config_to_toml).
std::string toml_value(const CLI::Option& option) {
  const std::string value = option.get_default_str();
  const std::string type = option.get_type_name();
  if (option.get_items_expected_max() > 1) {  // a list: "30 60 80" -> [30, 60, 80]
    std::istringstream items(value);
    std::string item, out;
    while (items >> item) out += (out.empty() ? "" : ", ") + item;
    return "[" + out + "]";
  }
  if (type == "BOOLEAN") return value == "1" || value == "true" ? "true" : "false";
  if (type == "TEXT") return "\"" + value + "\"";
  return value;
}

std::string config_to_toml(const Config& config) {
  Config copy = config;
  CLI::App app;
  add_options(app, copy);  // each option's default string is the resolved value
  std::string out, group;
  for (const CLI::Option* option : app.get_options()) {
    if (option->get_name() == "--help") continue;
    if (option->get_group() != group) {
      group = option->get_group();
      out += (out.empty() ? "# " : "\n# ") + group + "\n";
    }
    out += option->get_name().substr(2) + " = " + toml_value(*option) + "\n";
  }
  return out;
}

std::string config_reference_markdown() {
  Config defaults;
  CLI::App app;
  add_options(app, defaults);
  auto cell = [](std::string text) {  // a table cell: its own | would end it
    for (size_t at = text.find('|'); at != text.npos; at = text.find('|', at + 2))
      text.insert(at, "\\");
    return text;
  };
  std::string out, group;
  for (const CLI::Option* option : app.get_options()) {
    if (option->get_name() == "--help") continue;
    if (option->get_group() != group) {
      group = option->get_group();
      out += (out.empty() ? "### " : "\n### ") + group +
             "\n\n| key | default | what |\n| --- | --- | --- |\n";
    }
    out += "| `" + option->get_name().substr(2) + "` | `" + toml_value(*option) + "` | " +
           cell(option->get_description()) + " |\n";
  }
  return out;
}

}  // namespace trainer
