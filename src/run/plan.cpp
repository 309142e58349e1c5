#include "src/run/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "base/user_error.h"
#include "data/sources/step_shares.h"
#include "src/train/lr_schedule.h"

namespace trainer {
namespace {

// Images in one training epoch, and where the figure comes from.
std::pair<int64_t, std::string> epoch_images(const Config& c, int64_t given) {
  if (given > 0) return {given, "--plan_train_images"};
  switch (c.data_source) {
    case DataSource::kGenerated:
      return {c.generated_train_images, "generated_train_images"};
    case DataSource::kSynthetic:
      return {c.synthetic_batches_per_epoch * c.images_per_micro_batch(),
              "synthetic_batches_per_epoch x micro-batch x ranks"};
    default:
      return {kImageNetTrainImages,
              "ImageNet-1k's training set; the run counts its records, --plan_train_images N "
              "plans for another"};
  }
}

std::string micro_batch_text(const Config& c) {
  std::string text = std::to_string(c.micro_batch_size()) + " images";
  if (c.micro_batch_size() < c.batch_size)
    text += fmt::format(" (batch_size {} shrunk to fit global_batch {} on {} ranks)", c.batch_size,
                        c.global_batch, c.world_size);
  return text;
}

std::string step_text(const Config& c) {
  std::string text = std::to_string(c.images_per_step());
  if (c.global_batch == 0) return text + " (micro-batch x ranks: global_batch = 0)";
  if (c.images_per_step() == c.global_batch) return text + " (global_batch kept)";
  return text + fmt::format(
                    " (global_batch {} is no multiple of micro-batch x ranks = {}: the "
                    "nearest below)",
                    c.global_batch, c.images_per_micro_batch());
}

}  // namespace

std::string describe_plan(Config config, int world_size, int64_t train_images) {
  USER_CHECK(world_size >= 1, "--plan_world_size ", world_size, " must be >= 1 (ranks: GPUs)");
  USER_CHECK(train_images >= 0, "--plan_train_images ", train_images, " must be >= 1");
  config.world_size = world_size;
  validate_config(config);
  const Config& c = config;
  const auto [images, images_from] = epoch_images(c, train_images);
  const int64_t step = c.images_per_step();
  USER_CHECK(images >= c.images_per_micro_batch(), "an epoch of ", images,
             " images is less than one micro-batch of every rank (", c.images_per_micro_batch(),
             "). Fix: fewer ranks, or a smaller batch_size or global_batch");
  const int64_t per_epoch = steps_left(epoch_end(images, 0, c.whole_steps_of()), 0, step);
  int64_t total = per_epoch * c.epochs;
  if (c.max_steps > 0) total = std::min(total, c.max_steps);
  const int64_t warmup_images = std::llround(c.warmup_epochs * static_cast<double>(images));
  const int64_t warmup = std::min(total, (warmup_images + step - 1) / step);
  std::string out = fmt::format("plan for {} rank(s):\n", world_size);
  auto line = [&out](const char* what, const std::string& value) {
    out += fmt::format("  {:<26}{}\n", what, value);
  };
  line("micro-batch per GPU", micro_batch_text(c));
  line("micro-batches per step", std::to_string(c.micro_batches()));
  line("images per GPU per step", std::to_string(c.micro_batches() * c.micro_batch_size()));
  line("images per step", step_text(c));
  line("training images", fmt::format("{} ({})", images, images_from));
  line("steps per epoch",
       std::to_string(per_epoch) +
           (c.drop_last && images % step != 0
                ? fmt::format(" (drop_last: the last {} images not trained)", images % step)
                : ""));
  line("warmup steps", fmt::format("{} ({} epochs)", warmup, c.warmup_epochs));
  line("total steps",
       fmt::format("{} ({} epochs{})", total, c.epochs,
                   c.max_steps > 0 ? ", max_steps " + std::to_string(c.max_steps) : std::string()));
  line("peak learning rate", fmt::format("{:.6g} (base_lr {} per 256 images x {} / 256)",
                                         peak_lr(c.base_lr, step), c.base_lr, step));
  return out;
}

}  // namespace trainer
