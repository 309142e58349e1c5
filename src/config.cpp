#include "src/config.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <type_traits>

#include "base/user_error.h"
#include "src/config_input.h"

namespace trainer {

namespace {

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

std::string join(const std::vector<std::string>& values) {
  std::string out;
  for (const auto& v : values) out += (out.empty() ? "" : ", ") + v;
  return out;
}

// The value named `text` of a choice key; UserError naming the key and the valid names.
template <typename Choice>
Choice parse_choice(const std::string& key, const std::string& text, Choice type) {
  std::vector<std::string> names;
  for (const auto& choice : choice_names(type)) {
    if (text == choice.name) return choice.value;
    names.push_back(choice.name);
  }
  throw UserError("config key '" + key + "' = '" + text +
                  "' is not allowed; use one of: " + join(names));
}

// Binds every key of `c` to an option whose default is its current value, grouped for --help.
void add_options(CLI::App& app, Config& c) {
  // A choice key is read as its name and parsed at once; its default shows as a name.
  auto add_choice = [&](const char* group, const char* key, auto& field, const char* help) {
    using Choice = std::decay_t<decltype(field)>;
    CLI::Option* option = app.add_option_function<std::string>(
        std::string("--") + key,
        [key, &field](const std::string& text) { field = parse_choice(key, text, Choice{}); },
        help);
    option->default_str(name_of(field))->type_name("TEXT")->group(group);
    option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  };
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
  add("Output", "profile_steps", c.profile_steps,
      "steps to trace with the profiler into output_dir/profile (Perfetto, TensorBoard); 0: none");
  add("Output", "profile_first_step", c.profile_first_step, "the first step profile_steps traces");
  add_choice("Model", "arch", c.arch, "resnet18 | resnet34 | resnet50 | resnet101 | resnet152");
  add("Model", "num_classes", c.num_classes, "classifier width");
  add("Model", "zero_init_residual", c.zero_init_residual, "zero each block's last BN gamma");
  add_choice("Model", "weight_init", c.weight_init,
             "torchvision (Kaiming fan_out) | he_normal_fan_in (MLPerf TF2 reference)");
  add("Model", "init_weights", c.init_weights,
      "start from these weights: state dict or checkpoint file; \"\": none");
  add_choice("Model", "trainable", c.trainable, "all | classifier (linear probe)");
  add("Model", "blurpool", c.blurpool, "blur before each strided convolution (anti-aliasing)");
  add_choice("Device", "device", c.device, "auto | cuda | cpu");
  add_choice("Device", "precision", c.precision, "fp32 | fp16 (loss scaling) | bf16");
  add("Device", "channels_last", c.channels_last, "NHWC activations on the GPU");
  add("Device", "cudnn_benchmark", c.cudnn_benchmark, "cuDNN algorithm autotuning");
  add("Device", "fused_batch_norm", c.fused_batch_norm,
      "cuDNN's fused BN+ReLU and BN+add+ReLU on the GPU (fp16/bf16, channels_last)");
  add("Device", "fused_conv_batch_norm", c.fused_conv_batch_norm,
      "each bottleneck's first two BN+ReLUs inside the convolutions around them (cuDNN graphs)");
  add("Device", "fused_residual_gradient", c.fused_residual_gradient,
      "each block's input gradient summed inside its first convolution's dgrad (cuDNN graph)");
  add("Device", "compact_max_pool", c.compact_max_pool,
      "the stem's max pooling keeps a byte per output for backward, not an int64 (GPU)");
  add("Device", "cuda_graph", c.cuda_graph,
      "the step's forward, backward, all-reduce and update replayed as one CUDA graph (GPU)");
  add("Device", "stem_input_channels", c.stem_input_channels,
      "3 | 4 | 8: the channels the stem convolution reads, the image's and zeros (cuDNN's NHWC)");
  add("Device", "stem_space_to_depth", c.stem_space_to_depth,
      "the stem's 7x7/2 convolution as a 4x4/1 one of 16 channels over 2x2 pixel blocks (GPU)");
  add("Device", "gpu_memory_gib", c.gpu_memory_gib,
      "most GPU memory the allocator may take, GiB (e.g. 15: a 16 GB V100's); 0: the card's");
  add_choice("Data", "data_source", c.data_source, "synthetic | generated | tfrecord");
  add("Data", "batch_size", c.batch_size,
      "images per GPU and step; with global_batch, the most per micro-batch");
  add("Data", "image_size", c.image_size, "training crop, pixels (unless progressive resizing)");
  add("Data", "val_image_size", c.val_image_size, "evaluation centre crop, pixels; 0: image_size");
  add("Data", "synthetic_batches_per_epoch", c.synthetic_batches_per_epoch, "synthetic epoch");
  add("Data", "generated_classes", c.generated_classes, "generated source: classes");
  add("Data", "generated_train_images", c.generated_train_images, "generated: training images");
  add("Data", "generated_val_images", c.generated_val_images, "generated: held-out images");
  // Data: TFRecord input pipeline.
  add("Data", "train_data", c.train_data, "tfrecord: training files, glob or directory");
  add("Data", "val_data", c.val_data, "tfrecord: validation files, glob or directory");
  add_choice("Data", "record_layout", c.record_layout,
             "tfrecord: auto (from the first record) | tensorflow | tfds");
  add("Data", "label_offset", c.label_offset,
      "tfrecord: subtracted from labels; -1: the layout's (tensorflow 1, tfds 0)");
  add_choice("Data", "bad_record_policy", c.bad_record_policy, "tfrecord: skip | fail");
  add("Data", "max_bad_fraction", c.max_bad_fraction, "tfrecord: skip at most this fraction");
  add("Data", "reader_threads", c.reader_threads, "tfrecord: file reader threads per rank");
  add("Data", "decode_threads", c.decode_threads, "tfrecord: decode threads; 0: cores/ranks");
  add("Data", "prefetch_batches", c.prefetch_batches, "tfrecord: batches decoded ahead");
  add("Data", "shuffle_buffer", c.shuffle_buffer, "tfrecord: shuffle buffer, records (global)");
  add("Augmentation", "repeated_augmentation", c.repeated_augmentation,
      "tfrecord training: copies of each image an epoch shows, on other ranks; 1: off");
  add_choice("Data", "epoch_order", c.epoch_order,
             "tfrecord training: global | by_node (each node's records the same every epoch)");
  add("Data", "drop_last", c.drop_last,
      "training: an epoch ends at its last whole step; the images left after it are not trained");
  add("Data", "check_data_order", c.check_data_order,
      "training: stop when the records' order skews the classes a rank or a step trains");
  add("Data", "index_cache_dir", c.index_cache_dir, "tfrecord: index files for read-only data");
  add("Data", "class_names_file", c.class_names_file,
      "class names, one 'WNID words' per line; \"\": synsets.txt beside the data");
  add("Data", "val_resize", c.val_resize, "tfrecord: eval shorter side before centre crop");
  add_choice(
      "Augmentation", "train_crop", c.train_crop,
      "tfrecord training: random_resized | distorted_bounding_box (MLPerf TF2, record boxes)");
  add_choice("Augmentation", "auto_augment", c.auto_augment,
             "tfrecord training: none | trivialaugment_wide | randaugment | autoaugment_imagenet");
  add("Augmentation", "randaugment_num_ops", c.randaugment_num_ops,
      "randaugment: ops per image, 1-16");
  add("Augmentation", "randaugment_magnitude", c.randaugment_magnitude,
      "randaugment: magnitude bin of 31, 0-30");
  add_choice("Augmentation", "augment_interpolation", c.augment_interpolation,
             "the policy's shears, translations and rotations: nearest | bilinear");
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
  add_choice("Training", "loss", c.loss, "cross_entropy | bce (binary cross-entropy per class)");
  add("EMA", "ema_decay", c.ema_decay, "EMA of the weights: decay per update; 0: off");
  add("EMA", "ema_half_life_images", c.ema_half_life_images,
      "or: images after which a weight's share halves; 0: off");
  add("EMA", "ema_every_steps", c.ema_every_steps, "steps between EMA updates");
  add_choice("EMA", "ema_buffers", c.ema_buffers,
             "BN statistics of the EMA: copy (the model's) | average (torchvision's)");
  add("EMA", "ema_warmup_reset", c.ema_warmup_reset,
      "EMA updates in the LR warmup copy the weights (torchvision's train.py)");
  add_choice("Optimizer", "optimizer", c.optimizer, "sgd | lars");
  add("Optimizer", "base_lr", c.base_lr, "LR per 256 images (linear scaling rule)");
  add("Optimizer", "momentum", c.momentum, "in [0, 1)");
  add("Optimizer", "nesterov", c.nesterov, "Nesterov momentum");
  add("Optimizer", "weight_decay", c.weight_decay, ">= 0");
  add("Optimizer", "decay_bn_and_bias", c.decay_bn_and_bias, "decay (and LARS-scale) BN/bias");
  add("Optimizer", "lars_eta", c.lars_eta, "LARS trust coefficient");
  add("Optimizer", "grad_scale", c.grad_scale,
      "the step's gradient: its images' mean times this, > 0 (before decay and LARS)");
  add_choice("Schedule", "lr_schedule", c.lr_schedule, "cosine | step | poly");
  add("Schedule", "warmup_epochs", c.warmup_epochs, "linear warmup length, < epochs");
  add("Schedule", "lr_step_epochs", c.lr_step_epochs, "step: increasing epochs < epochs");
  add("Schedule", "lr_step_gamma", c.lr_step_gamma, "step: LR multiplier in (0, 1)");
  add("Schedule", "lr_poly_power", c.lr_poly_power, "poly: power > 0");
  add("Loss scaling", "loss_scale_init", c.loss_scale_init, "fp16: initial loss scale");
  add("Loss scaling", "loss_scale_growth_interval", c.loss_scale_growth_interval,
      "fp16: clean steps before the scale doubles");
  add("Data parallel", "bucket_mb", c.bucket_mb,
      "gradient bucket size cap, MB (the input-most bucket: 1 MB)");
  add_choice("Data parallel", "grad_average", c.grad_average,
             "pre | post: divide before/after the sum");
  add_choice("Data parallel", "grad_compression", c.grad_compression,
             "none | fp16 | bf16 on the wire");
  add("Data parallel", "collective_timeout_s", c.collective_timeout_s,
      "end the job when a collective hangs this long");
  add("Data parallel", "global_batch", c.global_batch,
      "images per step at any world size (accumulation, or smaller micro-batches); 0: "
      "batch_size x ranks");
  add("Checkpoints", "eval_every_epochs", c.eval_every_epochs, "0: only at the end");
  add("Checkpoints", "eval_flip", c.eval_flip, "evaluate the mean logits of image and mirror");
  add("Checkpoints", "target_top1", c.target_top1,
      "stop at the first evaluation with this top-1 %; 0: off");
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
  return name == "help" || name == "config" || name == "help_markdown" ||
         name == "plan_world_size" || name == "plan_train_images";
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

}  // namespace

std::optional<CommandLine> parse_command_line(int argc, const char* const argv[]) {
  CommandLine line;
  Config& config = line.config;
  CLI::App app{
      "Trains ResNet on one GPU, the CPU, or many GPUs under mpirun.\n"
      "Every key can be set in the --config file (key = value) and overridden as --key."};
  app.set_config("--config", "", "TOML file of `key = value` lines");
  app.allow_config_extras(CLI::config_extras_mode::error);
  app.allow_extras();  // unknown command-line options: reported below, with a suggestion
  add_options(app, config);
  bool markdown = false;
  app.add_flag("--help_markdown", markdown, "every key as Markdown tables (docs/configuration.md)");
  app.add_option("--plan_world_size", line.plan_world_size,
                 "print the run's plan on N ranks (batches, steps, learning rate) and exit: 0 "
                 "when it can start, 2 with the error and its fix");
  app.add_option("--plan_train_images", line.plan_train_images,
                 "the plan's training images per epoch (default: the data source's, or "
                 "ImageNet-1k's 1281167 for TFRecords)");
  const std::string hint = ". Run `train --help` for every key and its values.";
  check_config_files(argc, argv);
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
  check_text_values(app);
  return line;
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
  if (type == "TEXT") return "\"" + value + "\"";  // nothing to escape: check_text_values
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
