// The one configuration schema of `train`: every key, its default, and the rules that relate keys.
// Read from a TOML-style file of flat `key = value` lines (--config FILE) and overridden by
// `--key value` on the command line; validated in validate_config (src/config_validate.cpp), then
// made into each part's own options at one seam (src/part_options.h, src/sources.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/sources/tfrecord_source_options.h"
#include "data/transforms/augment.h"
#include "data/transforms/augment_policy.h"
#include "src/train/loss.h"
#include "src/train/lr_schedule.h"
#include "src/train/optimizer.h"
#include "src/train/weight_average.h"

namespace trainer {

// The keys that take one of a few values, each parsed once from its name (the names the config
// file, --help and config.toml use: choice_names in src/config.cpp). The parts' own choices
// (loss, optimizer, LR schedule, augmentation policy, record layout) are declared with the parts.
enum class Arch { kResNet18, kResNet34, kResNet50, kResNet101, kResNet152 };
enum class Trainable { kAll, kClassifier };  // classifier: a linear probe
enum class DeviceChoice { kAuto, kCuda, kCpu };
enum class Precision { kFp32, kFp16, kBf16 };
enum class DataSource { kSynthetic, kGenerated, kTfrecord };
enum class BadRecordPolicy { kSkip, kFail };
enum class GradAverage { kPre, kPost };
enum class GradCompression { kNone, kFp16, kBf16 };

struct Config {
  // Output: checkpoints, metrics.jsonl and the resolved config.toml go here.
  std::string output_dir = "runs/resnet50";
  bool tensorboard = true;  // rank 0 writes TensorBoard event files in <output_dir>/tensorboard
  // A profiler trace of profile_steps steps from step profile_first_step, each rank's in
  // <output_dir>/profile (src/train/step_profile.h); 0: none.
  int64_t profile_steps = 0;
  int64_t profile_first_step = 20;

  // Model.
  Arch arch = Arch::kResNet50;     // resnet18|34|50|101|152
  int64_t num_classes = 1000;      // width of the classifier
  bool zero_init_residual = true;  // zero each block's last BN gamma at initialisation
  // torchvision (Kaiming fan_out) | he_normal_fan_in (the MLPerf TF2 reference's Keras he_normal
  // convolutions, classifier N(0, 0.01)); models/resnet.h.
  WeightInit weight_init = WeightInit::kTorchvision;
  // A new run starts from these weights: a PyTorch state dict (torchvision's published weights)
  // or a checkpoint of ours; the classifier is re-initialised when num_classes differs. The
  // run's own checkpoint, once there is one, wins (Note [Where a run starts]).
  std::string init_weights;
  Trainable trainable = Trainable::kAll;  // all | classifier (linear probe: the rest frozen)
  // Anti-aliased strided convolutions (FFCV's and Composer's BlurPool): a fixed 3x3 binomial blur
  // before each strided convolution of the blocks. Same parameters as the plain model.
  bool blurpool = false;

  // Device and precision.
  DeviceChoice device = DeviceChoice::kAuto;  // auto (the local rank's GPU, else CPU) | cuda | cpu
  Precision precision = Precision::kFp32;     // fp32 | fp16 (dynamic loss scaling) | bf16
  bool channels_last = true;                  // NHWC activations on the GPU (ignored on the CPU)
  bool cudnn_benchmark = true;                // let cuDNN time its algorithms on the first steps
  // Each BN with its ReLU, or its residual add and ReLU, as one cuDNN kernel each way on the GPU
  // (fp16/bf16, channels_last, training); false: ATen's separate ops
  // (models/cuda/fused_batch_norm.h).
  bool fused_batch_norm = true;
  // Each bottleneck's bn1 and bn2 applied inside the convolution after them (scale, bias and ReLU
  // as it reads), their statistics written by the convolution before (models/conv_bn_fusion.h):
  // cuDNN graphs on the GPU (fp16/bf16, channels_last, training), the plain path elsewhere.
  bool fused_conv_batch_norm = false;
  // Each residual block's input gradient, its first convolution's plus its shortcut's, summed in
  // that convolution's dgrad (a cuDNN graph on the GPU, fp16/bf16, channels_last) instead of a
  // pass of its own (models/residual_gradient.h).
  bool fused_residual_gradient = false;
  // The stem's max pooling as the project's kernels (models/cuda/max_pool.h) on the GPU over
  // channels_last activations: ATen's values and gradients, with a byte per output kept for
  // backward instead of ATen's int64 index (3.7x ATen's pooling on an H200, docs/BENCHMARKS.md).
  bool compact_max_pool = true;
  // The training step's forward, backward, gradient all-reduce and update recorded once as a CUDA
  // graph and replayed each step (src/train/step_graph.h); ignored on the CPU.
  bool cuda_graph = false;
  // The channels the stem's convolution reads: 3, the image's; 4 or 8, the image and zero
  // channels, for cuDNN's NHWC kernels (models/resnet.h); the same results.
  int64_t stem_input_channels = 3;
  // The stem's convolution over 2x2 blocks of pixels on the GPU: a 4x4 convolution of 16 channels,
  // a shape Hopper's newer cuDNN kernels take, the same results (models/stem.h); conv1.weight
  // stays torchvision's. Takes the place of stem_input_channels.
  bool stem_space_to_depth = false;
  // The most GPU memory LibTorch's allocator may take, GiB (a smaller card's on a larger one, or a
  // share of a GPU); 0: the whole card. Ignored on the CPU.
  double gpu_memory_gib = 0;

  // Data.
  DataSource data_source = DataSource::kSynthetic;  // synthetic | generated (in memory) | tfrecord
  // Images per GPU (per process) and step; with global_batch, the most per micro-batch.
  int64_t batch_size = 256;
  int64_t image_size = 224;    // training crop, pixels (and val_image_size's default)
  int64_t val_image_size = 0;  // evaluation centre crop, pixels; 0: image_size
  int64_t synthetic_batches_per_epoch = 100;
  int64_t generated_classes = 10;         // generated source: classes (<= num_classes)
  int64_t generated_train_images = 2000;  // generated source: training images
  int64_t generated_val_images = 500;     // generated source: held-out images

  // Data: TFRecord input pipeline (data_source = "tfrecord"; data/sources/tfrecord_source.h).
  std::string train_data;  // glob or directory of training TFRecords (train-*)
  std::string val_data;    // glob or directory of validation TFRecords; "" = none
  // Which features hold the image and label: auto (from each split's first record) | tensorflow
  // (image/encoded, image/class/label) | tfds (TensorFlow Datasets: image, label).
  RecordLayout record_layout = RecordLayout::kAuto;
  // Subtracted from stored labels; -1: the layout's (tensorflow: 1, 1..1000 -> 0..999; tfds: 0).
  int64_t label_offset = -1;
  BadRecordPolicy bad_record_policy = BadRecordPolicy::kSkip;  // skip (log, count, drop) | fail
  double max_bad_fraction = 0.001;  // skip: stop when more of an epoch's records are bad
  int64_t reader_threads = 2;       // file reader threads per rank
  int64_t decode_threads = 0;       // decode/augment threads per rank; 0: cores / local ranks
  // Decoded batches held ready ahead of the trainer: the source's own default.
  int64_t prefetch_batches = TFRecordSourceOptions{}.prefetch_batches;
  int64_t shuffle_buffer = 1024;  // records mixed across read blocks (training, global order)
  // global: one shuffled order; by_node: each node reads the same records every epoch, which its
  // page cache keeps (Note [Records by node] in data/sources/epoch_plan.h).
  EpochOrder epoch_order = EpochOrder::kGlobal;
  // Copies of each image an epoch shows, each to another rank with its own augmentation
  // (torchvision's --ra-sampler --ra-reps); the epoch keeps its length. 1: off.
  int64_t repeated_augmentation = 1;
  // Training: each epoch ends at its last whole step instead of training what is left after it
  // (PyTorch's DataLoader drop_last; Note [The last partial step] in data/sources/step_shares.h).
  bool drop_last = false;
  // Training: stop early in the run when the order of the records skews what a rank or a step
  // trains, as records written in class order do (Note [Data order that skews training] in
  // src/data_order_check.h).
  bool check_data_order = true;
  std::string index_cache_dir = "/tmp/resnet-trainer-index";  // index files when data is read-only
  // The classes' names in label order (data/datasets/class_names.h), kept in checkpoints and
  // checked against them; "": synsets.txt, else label.labels.txt, beside train_data's files, else
  // beside val_data's (src/data_classes.h).
  std::string class_names_file;
  int64_t val_resize = 256;  // evaluation: shorter side before the centre crop
  // The training crop (data/transforms/augment.h): random_resized (torchvision's
  // RandomResizedCrop) | distorted_bounding_box (the MLPerf TF2 reference's
  // tf.image.sample_distorted_bounding_box over the records' boxes).
  TrainCrop train_crop = TrainCrop::kRandomResized;
  // Augmentation of each training crop after the crop and flip, in the decode threads, as
  // torchvision.transforms.v2 (data/transforms/augment_policy.h; docs/training.md). Evaluation
  // never augments.
  // none | trivialaugment_wide | randaugment | autoaugment_imagenet
  AutoAugmentPolicy auto_augment = AutoAugmentPolicy::kNone;
  int64_t randaugment_num_ops = 2;    // randaugment: ops applied one after the other
  int64_t randaugment_magnitude = 9;  // randaugment: magnitude bin of 31 (0..30)
  Interpolation augment_interpolation = Interpolation::kNearest;  // the policy's geometric ops
  double random_erasing = 0;  // probability of erasing one rectangle; 0: never

  // Progressive resizing (FFCV): each epoch's training crop instead of image_size, a linear ramp
  // from min to max between two epochs in multiples of step (Note [Image size per epoch] in
  // data/sources/image_size_schedule.h). min = max = 0: off.
  int64_t progressive_resize_min_size = 0;     // pixels, up to start_epoch
  int64_t progressive_resize_max_size = 0;     // pixels, from end_epoch on
  int64_t progressive_resize_start_epoch = 0;  // 0-based, as FFCV's start_ramp
  int64_t progressive_resize_end_epoch = 0;    // 0-based, as FFCV's end_ramp
  int64_t progressive_resize_step = 32;        // sizes on the ramp: multiples of this

  // Training length and loss.
  int64_t epochs = 90;
  int64_t max_steps = 0;  // stop after this many steps in total; 0: run all epochs
  uint64_t seed = 42;
  double label_smoothing = 0.1;
  LossKind loss = LossKind::kCrossEntropy;  // cross_entropy (softmax) | bce (sigmoid per class)
  // MixUp and CutMix on each training batch (src/train/batch_mixing.h): Beta(alpha, alpha); 0: off.
  // With both on, each batch takes one of them at random (torchvision's recipe: 0.2 and 1.0).
  double mixup_alpha = 0;
  double cutmix_alpha = 0;

  // EMA of the weights (src/train/weight_average.h): evaluated beside them, saved in checkpoints.
  // Off unless one of the two decays is set: per update, or as the images after which an image's
  // weight has halved (kept across resizes, whatever the images per step).
  double ema_decay = 0;
  double ema_half_life_images = 0;
  int64_t ema_every_steps = 1;                 // steps between updates
  EmaBuffers ema_buffers = EmaBuffers::kCopy;  // copy | average (Note [EMA buffers])
  bool ema_warmup_reset = false;  // torchvision's: the LR warmup's updates copy the weights

  // Optimizer.
  OptimizerKind optimizer = OptimizerKind::kSgd;  // sgd | lars
  double base_lr = 0.1;  // learning rate per 256 images; scaled by global batch / 256
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 1e-4;
  bool decay_bn_and_bias = false;  // false: no weight decay (nor LARS scaling) on BN and biases
  double lars_eta = 0.001;         // LARS trust coefficient
  // The step's gradient is the mean over its images times this, before weight decay and the LARS
  // trust ratio (folded into the loss's backward weight). 2 trains as the MLPerf TF2 reference's
  // 1024 x 2 accumulation, which adds its micro-batches' mean gradients.
  double grad_scale = 1.0;

  // Learning-rate schedule: linear warmup, then decay.
  LrScheduleKind lr_schedule = LrScheduleKind::kCosine;  // cosine | step | poly
  double warmup_epochs = 5;
  std::vector<int64_t> lr_step_epochs = {30, 60, 80};  // step: epochs where the LR is multiplied
  double lr_step_gamma = 0.1;                          // step: the multiplier
  double lr_poly_power = 2.0;                          // poly: (1 - progress)^power

  // Dynamic loss scaling (fp16 only).
  double loss_scale_init = 65536.0;
  int64_t loss_scale_growth_interval = 2000;  // clean steps before the scale doubles

  // Data parallelism (under mpirun): gradient buckets all-reduced during backward.
  int64_t bucket_mb = 25;  // bucket size; DDP uses 25, Horovod fuses up to 64
  GradAverage grad_average =
      GradAverage::kPre;  // pre: divide by ranks before summing (no overflow)
  GradCompression grad_compression =
      GradCompression::kNone;          // none | fp16 | bf16 on the wire (GPU)
  int64_t collective_timeout_s = 300;  // a collective unfinished after this ends the job
  // Images per optimisation step whatever the number of ranks: each rank accumulates gradients
  // over as many batches as it takes (Note [Fixed global batch] in src/fit.cpp). 0: batch_size x
  // ranks, and the learning rate follows the world size (linear scaling rule).
  int64_t global_batch = 0;

  // Evaluation, checkpoints and logs.
  int64_t eval_every_epochs = 1;  // also evaluated at the end; 0: only at the end
  // Evaluation scores the mean of the logits of each image and of its mirror (FFCV's lr_tta).
  bool eval_flip = false;
  // Top-1 percent at which training stops, at the first evaluation that reaches it (MLPerf's
  // rule; the time to it is logged); 0: train all epochs.
  double target_top1 = 0;
  int64_t checkpoint_every_steps = 0;  // 0: at the end of each epoch only
  int64_t keep_checkpoints = 3;        // newest K kept
  std::string resume = "auto";         // auto (newest in output_dir) | none | a checkpoint path
  // Evaluate init_weights, else the checkpoint `resume` names, on the validation data; then exit.
  bool evaluate_only = false;
  int64_t log_every_steps = 50;

  // Benchmark mode: synthetic data, images/s and step-time percentiles after warm-up.
  bool benchmark = false;
  int64_t benchmark_warmup_steps = 20;
  int64_t benchmark_steps = 100;

  // Set by `train` from the launcher, not settable.
  int world_size = 1;
  int restart_count = 0;  // restarts of the group by torchrun's elastic agent (for the log)
  // Started by torchrun's elastic agent: any start may be a later round of a running job (after a
  // failure or a change of members), so the run's own newest checkpoint comes first.
  bool elastic = false;
  // Images per rank in one batch (a micro-batch when accumulating): batch_size, or fewer where
  // global_batch leaves fewer per rank (Note [Fixed global batch] in src/fit.cpp).
  int64_t micro_batch_size() const {
    if (global_batch == 0 || global_batch >= batch_size * world_size) return batch_size;
    return std::max<int64_t>(1, global_batch / world_size);
  }
  // Images in one batch of every rank.
  int64_t images_per_micro_batch() const { return micro_batch_size() * world_size; }
  // Batches each rank accumulates per step: global_batch's nearest smaller multiple.
  int64_t micro_batches() const {
    return global_batch > 0 ? std::max<int64_t>(1, global_batch / images_per_micro_batch()) : 1;
  }
  int64_t images_per_step() const { return micro_batches() * images_per_micro_batch(); }
  // What the sources' and the loop's epoch_end takes: a step's images with drop_last, else 0.
  int64_t whole_steps_of() const { return drop_last ? images_per_step() : 0; }
  int64_t eval_image_size() const { return val_image_size > 0 ? val_image_size : image_size; }
  bool progressive_resize() const {
    return progressive_resize_min_size != 0 || progressive_resize_max_size != 0;
  }
  // The smallest training crop of the run, pixels.
  int64_t smallest_train_image_size() const {
    return progressive_resize() ? progressive_resize_min_size : image_size;
  }
};

// The names of a choice key's values, in the order --help lists them, and the name of one value
// ("fp16"): the same tables parse the keys, write config.toml and name the values in logs.
template <typename Choice>
struct ChoiceName {
  Choice value;
  const char* name;
};
const std::vector<ChoiceName<Arch>>& choice_names(Arch);
const std::vector<ChoiceName<Trainable>>& choice_names(Trainable);
const std::vector<ChoiceName<DeviceChoice>>& choice_names(DeviceChoice);
const std::vector<ChoiceName<Precision>>& choice_names(Precision);
const std::vector<ChoiceName<DataSource>>& choice_names(DataSource);
const std::vector<ChoiceName<BadRecordPolicy>>& choice_names(BadRecordPolicy);
const std::vector<ChoiceName<RecordLayout>>& choice_names(RecordLayout);
const std::vector<ChoiceName<AutoAugmentPolicy>>& choice_names(AutoAugmentPolicy);
const std::vector<ChoiceName<LossKind>>& choice_names(LossKind);
const std::vector<ChoiceName<OptimizerKind>>& choice_names(OptimizerKind);
const std::vector<ChoiceName<LrScheduleKind>>& choice_names(LrScheduleKind);
const std::vector<ChoiceName<GradAverage>>& choice_names(GradAverage);
const std::vector<ChoiceName<GradCompression>>& choice_names(GradCompression);
const std::vector<ChoiceName<EmaBuffers>>& choice_names(EmaBuffers);
const std::vector<ChoiceName<Interpolation>>& choice_names(Interpolation);
const std::vector<ChoiceName<TrainCrop>>& choice_names(TrainCrop);
const std::vector<ChoiceName<EpochOrder>>& choice_names(EpochOrder);
const std::vector<ChoiceName<WeightInit>>& choice_names(WeightInit);

template <typename Choice>
std::string name_of(Choice value) {
  for (const auto& choice : choice_names(value))
    if (choice.value == value) return choice.name;
  return "(unnamed " + std::to_string(static_cast<int>(value)) + ")";  // a table lacks a value
}

// What `train`'s command line asks for: a run of `config`, or the plan of that run on
// `plan_world_size` ranks (src/run_plan.h).
struct CommandLine {
  Config config;                  // not validated yet: the rules depend on the world size
  int plan_world_size = 0;        // --plan_world_size N: print the plan for N ranks and exit
  int64_t plan_train_images = 0;  // --plan_train_images N: the plan's epoch (0: the source's)
};

// Parses `train [--config FILE] [--key value ...]`: the file's keys, then the command line's,
// which win. Returns nullopt after printing --help (or --help_markdown). Throws UserError naming
// the key, its value and the allowed values, or the unknown key and the nearest one.
std::optional<CommandLine> parse_command_line(int argc, const char* const argv[]);

// Checks every value and every relation between values at config.world_size ranks; throws
// UserError on the first violation. `train` runs it once, when the launcher has said the world
// size.
void validate_config(const Config& config);

// The resolved configuration, every key, in the file format --config reads.
std::string config_to_toml(const Config& config);

// Every key with its default and help, as Markdown tables by group (`train --help_markdown`,
// the reference in docs/configuration.md).
std::string config_reference_markdown();

}  // namespace trainer
