// What the training, checkpoint and capture-schedule tests share: a scratch folder removed when
// the program ends, and a small CPU run (ResNet-18, 32 px, 4 classes of generated images).
#pragma once

#include <filesystem>
#include <string>

#include "src/config/config.h"
#include "tests/support/temp_dir.h"

namespace trainer {

// The folder of this program's checkpoints and logs, removed when it ends.
inline const std::filesystem::path& scratch() {
  static const testing::TempDir dir;
  return dir.path();
}

inline Config small_config(const std::string& name) {
  Config c;
  c.arch = Arch::kResNet18;
  c.num_classes = 4;
  c.data_source = DataSource::kGenerated;
  c.generated_classes = 4;
  c.generated_train_images = 96;  // 3 steps per epoch of 32
  c.generated_val_images = 40;
  c.image_size = 32;
  c.batch_size = 32;
  c.epochs = 4;
  c.warmup_epochs = 1;
  c.base_lr = 0.4;
  c.weight_decay = 5e-5;
  c.label_smoothing = 0.0;
  c.log_every_steps = 2;
  c.resume = "auto";
  c.output_dir = (scratch() / name).string();
  validate_config(c);
  return c;
}

}  // namespace trainer
