// The one configuration schema of `train`: the keys (declared once, in src/config/keys.def), the
// values the launcher sets, and what follows from them. Read from a TOML-style file of flat
// `key = value` lines (--config FILE) and overridden by `--key value` on the command line;
// validated in validate_config (src/config/validate.cpp), then made into each part's own options
// at one seam (src/part_options.h, src/sources.h).
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
// file, --help and config.toml use: choice_names in src/config/choices.cpp). The parts' own choices
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
  // Every key, with its default: src/config/keys.def.
#define CONFIG_KEY(group, type, name, default_value, limits, help) type name = default_value;
#include "src/config/keys.def"
#undef CONFIG_KEY

  // Set by `train` from the launcher, not settable.
  int world_size = 1;
  int restart_count = 0;  // restarts of the group by torchrun's elastic agent (for the log)
  // Started by torchrun's elastic agent: any start may be a later round of a running job (after a
  // failure or a change of members), so the run's own newest checkpoint comes first.
  bool elastic = false;
  // Images per rank in one batch (a micro-batch when accumulating): batch_size, or fewer where
  // global_batch leaves fewer per rank (Note [Fixed global batch] in src/run/fit.cpp).
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
  // epoch_end's `whole_steps_of` for the sources and the loop: a step's images with drop_last,
  // else 0 (the epoch ends with its last image).
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
// `plan_world_size` ranks (src/run/plan.h).
struct CommandLine {
  Config config;                  // not validated yet: the rules depend on the world size
  int plan_world_size = 0;        // --plan_world_size N: print the plan for N ranks and exit
  int64_t plan_train_images = 0;  // --plan_train_images N: the plan's epoch (0: the source's)
};

// Parses `train [--config FILE] [--key value ...]`: the file's keys, then the command line's,
// which win. Returns nullopt after printing --help (or --help_markdown). Throws UserError naming
// the key, its value and the allowed values, or the unknown key and the nearest one.
std::optional<CommandLine> parse_command_line(int argc, const char* const argv[]);

// Checks each key's value within its own limits (src/config/keys.def), which no other key and no
// world size changes; throws UserError naming the first key outside them.
void validate_keys(const Config& config);

// Checks every value (validate_keys) and every relation between values at config.world_size
// ranks; throws UserError on the first violation. `train` runs it once, when the launcher has
// said the world size.
void validate_config(const Config& config);

// The resolved configuration, every key, in the file format --config reads.
std::string config_to_toml(const Config& config);

// Every key with its default and help, as Markdown tables by group (`train --help_markdown`,
// the reference in docs/configuration.md).
std::string config_reference_markdown();

}  // namespace trainer
