// The configuration schema: file + command-line overrides, and every invalid value rejected with
// a message naming the key.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/user_error.h"
#include "src/config/config.h"
#include "tests/support/temp_dir.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

std::optional<Config> parse(std::vector<std::string> args) {
  args.insert(args.begin(), "train");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  const auto line = parse_command_line(static_cast<int>(argv.size()), argv.data());
  if (!line) return std::nullopt;
  validate_config(line->config);  // at one rank, as `train` alone
  return line->config;
}

// A file in a folder of this program's, removed when it ends.
fs::path write_file(const std::string& name, const std::string& text) {
  static const testing::TempDir folder;
  fs::path path = folder.path() / name;
  std::ofstream(path) << text;
  return path;
}

// The UserError message of parsing `args`, or "" if it parsed.
std::string error_of(const std::vector<std::string>& args) {
  try {
    parse(args);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, ConfigFilesOverTheSizeLimitAreRefusedBeforeReading) {
  const fs::path normal = write_file("normal.toml", "batch_size = 64\n");
  EXPECT_EQ(parse({"--config", normal.string()})->batch_size, 64);
  const fs::path huge = write_file("huge.toml", "batch_size = 64\n");
  fs::resize_file(huge, (int64_t(1) << 20) + 1);  // one byte over 1 MiB, sparse
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--config", huge.string()}, {"--config=" + huge.string()}}) {
    const std::string error = error_of(args);
    EXPECT_NE(error.find(huge.string()), std::string::npos) << error;
    EXPECT_NE(error.find("1048577 bytes, over the limit of 1048576"), std::string::npos) << error;
  }
}

TEST(Config, DefaultsAreValid) {
  auto config = parse({});
  ASSERT_TRUE(config.has_value());
  EXPECT_EQ(config->arch, Arch::kResNet50);
  EXPECT_EQ(config->batch_size, 256);
}

TEST(Config, FixResAndProgressiveResizing) {
  // torchvision's V2 recipe: train at 176, evaluate the centre 224 of the shorter side at 232.
  auto v2 = parse({"--image_size", "176", "--val_image_size", "224", "--val_resize", "232"});
  EXPECT_EQ(v2->image_size, 176);
  EXPECT_EQ(v2->eval_image_size(), 224);
  EXPECT_FALSE(v2->progressive_resize());
  EXPECT_EQ(parse({"--image_size", "192"})->eval_image_size(), 192);  // 0: the training crop
  // FFCV's 16-epoch ResNet-50: 160 -> 192 px over epochs 11 to 13.
  auto ffcv = parse({"--epochs", "16", "--progressive_resize_min_size", "160",
                     "--progressive_resize_max_size", "192", "--progressive_resize_start_epoch",
                     "11", "--progressive_resize_end_epoch", "13", "--val_image_size", "256",
                     "--val_resize", "292"});
  EXPECT_TRUE(ffcv->progressive_resize());
  EXPECT_EQ(ffcv->smallest_train_image_size(), 160);
}

TEST(Config, FileValuesAndCommandLineOverrides) {
  auto path = write_file("a.toml",
                         "# comment\narch = \"resnet18\"\nbatch_size = 8\n"
                         "lr_step_epochs = [2, 4]\nnesterov = true\n");
  auto config = parse({"--config", path.string(), "--batch_size", "16"});
  EXPECT_EQ(config->arch, Arch::kResNet18);
  EXPECT_EQ(config->batch_size, 16);  // the command line wins
  EXPECT_EQ(config->lr_step_epochs, (std::vector<int64_t>{2, 4}));
  EXPECT_TRUE(config->nesterov);
  EXPECT_EQ(parse({"--batch_size", "8", "--batch_size", "4"})->batch_size, 4);  // last one wins
}

TEST(Config, ResolvedTomlReadsBackToTheSameConfig) {
  auto config = parse({"--arch", "resnet34", "--base_lr", "0.3", "--precision", "bf16",
                       "--lr_step_epochs", "10", "20", "--nesterov", "true"});
  auto path = write_file("resolved.toml", config_to_toml(*config));
  auto again = parse({"--config", path.string()});
  EXPECT_EQ(config_to_toml(*again), config_to_toml(*config));
  EXPECT_EQ(again->arch, Arch::kResNet34);
  EXPECT_DOUBLE_EQ(again->base_lr, 0.3);
  EXPECT_EQ(again->lr_step_epochs, (std::vector<int64_t>{10, 20}));
}

TEST(Config, ResolvedTomlKeepsEveryDigit) {
  // iostreams' 6 significant digits would write 3.05176e-05 and 0.998908.
  auto config = parse(
      {"--weight_decay", "3.0517578125e-05", "--base_lr", "0.10625", "--momentum", "0.9989077333"});
  const std::string toml = config_to_toml(*config);
  EXPECT_NE(toml.find("weight_decay = 3.0517578125e-05\n"), std::string::npos) << toml;
  EXPECT_NE(toml.find("base_lr = 0.10625\n"), std::string::npos) << toml;
  EXPECT_NE(toml.find("momentum = 0.9989077333\n"), std::string::npos) << toml;
  EXPECT_NE(toml.find("label_smoothing = 0.1\n"), std::string::npos) << toml;  // short stays short
  auto again = parse({"--config", write_file("digits.toml", toml).string()});
  EXPECT_EQ(again->weight_decay, 3.0517578125e-05);
  EXPECT_EQ(again->momentum, 0.9989077333);
}

// Found by tests/fuzz/fuzz_config: CLI11's TOML reader ends a quoted value at a quote inside it,
// cuts it at '#' and splits it at ',', so such values neither read from a file as written nor
// read back from the resolved config.toml.
TEST(Config, TextValuesAreOnesTheConfigFileKeepsWhole) {
  auto config = parse({"--output_dir", "runs/my run", "--train_data", "it's/[a-z]*\\d"});
  const std::string toml = config_to_toml(*config);
  auto again = parse({"--config", write_file("text.toml", toml).string()});
  EXPECT_EQ(again->output_dir, "runs/my run") << toml;
  EXPECT_EQ(again->train_data, "it's/[a-z]*\\d") << toml;
  EXPECT_EQ(config_to_toml(*again), toml);
  for (const std::string& value : {"runs/\"x\"", "runs\\", "a#1", "a,b", "line\nbreak"}) {
    const std::string error = error_of({"--output_dir", value});
    EXPECT_NE(error.find("config key 'output_dir' = '" + value + "' holds "), std::string::npos)
        << error;
    EXPECT_NE(error.find("Fix: give the value without it"), std::string::npos) << error;
  }
  // In a file, before CLI11 cuts or splits the value; a comment after it is fine.
  const auto file = write_file("marks.toml",
                               "# a = \"x,y\"\narch = \"resnet18\"  # small\n"
                               "output_dir = \"runs/a,b\"\n");
  const std::string error = error_of({"--config", file.string()});
  EXPECT_NE(error.find(" line 3: the value of 'output_dir' holds ',', which CLI11's reader takes "
                       "for a list"),
            std::string::npos)
      << error;
}

TEST(Config, ShippedConfigsAreValid) {
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(TRAINER_CONFIG_DIR)) {
    if (entry.path().extension() != ".toml") continue;
    EXPECT_NO_THROW(parse({"--config", entry.path().string()})) << entry.path();
    ++checked;
  }
  EXPECT_GE(checked, 5);
}

TEST(Config, HelpReturnsNothing) { EXPECT_FALSE(parse({"--help"}).has_value()); }

TEST(Config, UnknownKeysAreRejected) {
  auto path = write_file("unknown.toml", "epochs = 2\nbatch_sise = 8\n");
  EXPECT_EQ(error_of({"--config", path.string()}),
            "config file " + path.string() +
                ": 'batch_sise' is not a key (did you mean batch_size?). Run `train --help` for "
                "every key and its values.");
  EXPECT_NE(error_of({"--learning_rate", "0.1"}).find("unknown option --learning_rate."),
            std::string::npos);  // no key is close: no suggestion
  EXPECT_NE(error_of({"--batch_size", "8", "--warmup_epoch=1"})
                .find("unknown option --warmup_epoch (did you mean --warmup_epochs?)"),
            std::string::npos);
  EXPECT_NE(error_of({"resnet50"}).find("unexpected argument 'resnet50'"), std::string::npos);
  // An unquoted glob, expanded by the shell: every file after the first is left over.
  EXPECT_NE(error_of({"--train_data", "/d/train-0", "/d/train-1"}).find("quote a glob"),
            std::string::npos);
}

TEST(Config, TablesInTheFileAreRejected) {  // a TOML habit; the schema is flat
  auto path = write_file("table.toml", "[train]\nbatch_size = 8\n");
  EXPECT_NE(error_of({"--config", path.string()}).find("has a [train] table"), std::string::npos);
}

TEST(Config, MissingConfigFileIsNamed) {
  EXPECT_NE(error_of({"--config", "/nonexistent/x.toml"}).find("/nonexistent/x.toml"),
            std::string::npos);
}

TEST(Config, AugmentationKeys) {
  auto config = parse({"--data_source", "tfrecord", "--train_data", "/d", "--auto_augment",
                       "randaugment", "--randaugment_num_ops", "3", "--randaugment_magnitude", "30",
                       "--random_erasing", "0.25"});
  EXPECT_EQ(config->auto_augment, AutoAugmentPolicy::kRandAugment);
  EXPECT_EQ(config->randaugment_num_ops, 3);
  EXPECT_EQ(config->randaugment_magnitude, 30);
  EXPECT_EQ(config->random_erasing, 0.25);
  EXPECT_EQ(parse({})->auto_augment, AutoAugmentPolicy::kNone);  // off by default
  EXPECT_EQ(parse({})->random_erasing, 0.0);
  EXPECT_EQ(parse({})->train_crop, TrainCrop::kRandomResized);  // torchvision's by default
  EXPECT_EQ(parse({"--data_source", "tfrecord", "--train_data", "/d", "--train_crop",
                   "distorted_bounding_box"})
                ->train_crop,
            TrainCrop::kDistortedBoundingBox);
}

TEST(Config, NonNumericValueIsRejected) {
  EXPECT_NE(error_of({"--batch_size", "many"}).find("batch_size"), std::string::npos);
}

struct BadValue {
  std::vector<std::string> args;
  std::string key;  // must appear in the message
};

class ConfigRejects : public ::testing::TestWithParam<BadValue> {};

TEST_P(ConfigRejects, NamingTheKey) {
  const std::string message = error_of(GetParam().args);
  ASSERT_FALSE(message.empty()) << "accepted: " << GetParam().args[0];
  EXPECT_NE(message.find(GetParam().key), std::string::npos) << message;
}

INSTANTIATE_TEST_SUITE_P(
    BadValues, ConfigRejects,
    ::testing::Values(
        BadValue{{"--batch_size", "0"}, "batch_size"},
        BadValue{{"--batch_size", "-4"}, "batch_size"}, BadValue{{"--base_lr", "-0.1"}, "base_lr"},
        BadValue{{"--base_lr", "0"}, "base_lr"}, BadValue{{"--precision", "fp8"}, "precision"},
        BadValue{{"--device", "tpu"}, "device"}, BadValue{{"--arch", "resnet51"}, "arch"},
        BadValue{{"--optimizer", "adam"}, "optimizer"},
        BadValue{{"--lr_schedule", "linear"}, "lr_schedule"},
        BadValue{{"--data_source", "s3"}, "data_source"},
        BadValue{{"--epochs", "10", "--warmup_epochs", "12"}, "warmup_epochs"},
        BadValue{{"--epochs", "10", "--warmup_epochs", "10"}, "warmup_epochs"},
        BadValue{{"--epochs", "0"}, "epochs"}, BadValue{{"--momentum", "1.0"}, "momentum"},
        BadValue{{"--momentum", "0", "--nesterov", "true"}, "nesterov"},
        BadValue{{"--weight_decay", "-1e-4"}, "weight_decay"},
        BadValue{{"--label_smoothing", "1"}, "label_smoothing"},
        BadValue{{"--image_size", "16"}, "image_size"},
        BadValue{{"--batch_size", "1", "--image_size", "32"}, "batch_size"},
        BadValue{{"--num_classes", "0"}, "num_classes"},
        BadValue{{"--lr_schedule", "step", "--epochs", "10", "--lr_step_epochs", "5", "3"},
                 "lr_step_epochs"},
        BadValue{{"--lr_schedule", "step", "--epochs", "10", "--lr_step_epochs", "12"},
                 "lr_step_epochs"},
        BadValue{{"--lr_schedule", "step", "--lr_step_gamma", "1.5"}, "lr_step_gamma"},
        BadValue{{"--keep_checkpoints", "0"}, "keep_checkpoints"},
        BadValue{{"--log_every_steps", "0"}, "log_every_steps"},
        BadValue{{"--loss_scale_init", "0.5"}, "loss_scale_init"},
        BadValue{{"--data_source", "generated", "--generated_classes", "20", "--num_classes", "10"},
                 "generated_classes"},
        BadValue{
            {"--data_source", "generated", "--batch_size", "64", "--generated_train_images", "32"},
            "generated_train_images"},
        BadValue{{"--benchmark", "true", "--data_source", "generated", "--num_classes", "10"},
                 "benchmark"},
        BadValue{{"--max_steps", "-1"}, "max_steps"},
        BadValue{{"--grad_compression", "int8"}, "grad_compression"},
        BadValue{{"--grad_average", "mean"}, "grad_average"},
        BadValue{{"--bucket_mb", "0"}, "bucket_mb"},
        BadValue{{"--weight_init", "he_normal"}, "weight_init"},
        BadValue{{"--grad_scale", "0"}, "grad_scale"},
        BadValue{{"--grad_scale", "-1"}, "grad_scale"},
        BadValue{{"--collective_timeout_s", "0"}, "collective_timeout_s"},
        BadValue{{"--gpu_memory_gib", "-1"}, "gpu_memory_gib"},
        BadValue{{"--gpu_memory_gib", "nan"}, "gpu_memory_gib"},
        BadValue{{"--stem_space_to_depth", "false", "--stem_input_channels", "5"},
                 "stem_input_channels"},
        BadValue{{"--stem_space_to_depth", "true", "--stem_input_channels", "8"},
                 "stem_input_channels"},
        BadValue{{"--loss", "focal"}, "loss"}, BadValue{{"--mixup_alpha", "-0.2"}, "mixup_alpha"},
        BadValue{{"--cutmix_alpha", "-1"}, "cutmix_alpha"},
        BadValue{{"--ema_warmup_reset", "true"}, "ema_warmup_reset"},
        BadValue{{"--ema_buffers", "average"}, "ema_buffers"},
        BadValue{{"--ema_buffers", "mean", "--ema_decay", "0.9"}, "ema_buffers"},
        BadValue{{"--augment_interpolation", "bicubic"}, "augment_interpolation"},
        BadValue{{"--epoch_order", "random"}, "epoch_order"},
        BadValue{{"--repeated_augmentation", "0"}, "repeated_augmentation"},
        BadValue{{"--target_top1", "101"}, "target_top1"},
        BadValue{
            {"--target_top1", "75", "--data_source", "tfrecord", "--train_data", "/data/train-*"},
            "target_top1"},
        BadValue{{"--repeated_augmentation", "4", "--data_source", "generated"},
                 "repeated_augmentation"},
        BadValue{{"--epoch_order", "by_node", "--data_source", "generated"}, "epoch_order"},
        BadValue{{"--ema_decay", "1"}, "ema_decay"},
        BadValue{{"--ema_half_life_images", "-5"}, "ema_half_life_images"},
        BadValue{{"--ema_decay", "0.999", "--ema_half_life_images", "1e6"}, "ema_half_life_images"},
        BadValue{{"--ema_every_steps", "0"}, "ema_every_steps"},
        BadValue{{"--val_image_size", "16"}, "val_image_size"},
        BadValue{{"--data_source", "tfrecord", "--train_data", "/data/train-*", "--val_image_size",
                  "288", "--val_resize", "256"},
                 "val_resize"},
        BadValue{{"--progressive_resize_step", "0"}, "progressive_resize_step"},
        BadValue{{"--progressive_resize_min_size", "160"}, "progressive_resize_max_size"},
        BadValue{{"--progressive_resize_max_size", "192"}, "progressive_resize_min_size"},
        BadValue{{"--progressive_resize_min_size", "16", "--progressive_resize_max_size", "32",
                  "--progressive_resize_step", "16", "--progressive_resize_end_epoch", "2"},
                 "progressive_resize_min_size"},
        BadValue{{"--progressive_resize_min_size", "192", "--progressive_resize_max_size", "160",
                  "--progressive_resize_end_epoch", "2"},
                 "progressive_resize_max_size"},
        BadValue{{"--progressive_resize_min_size", "150", "--progressive_resize_max_size", "192",
                  "--progressive_resize_end_epoch", "2"},
                 "progressive_resize_min_size"},
        BadValue{{"--progressive_resize_min_size", "160", "--progressive_resize_max_size", "200",
                  "--progressive_resize_end_epoch", "2"},
                 "progressive_resize_max_size"},
        BadValue{{"--progressive_resize_min_size", "160", "--progressive_resize_max_size", "192",
                  "--progressive_resize_start_epoch", "-1", "--progressive_resize_end_epoch", "2"},
                 "progressive_resize_start_epoch"},
        BadValue{{"--progressive_resize_min_size", "160", "--progressive_resize_max_size", "192",
                  "--progressive_resize_start_epoch", "5", "--progressive_resize_end_epoch", "5"},
                 "progressive_resize_end_epoch"},
        BadValue{{"--epochs", "16", "--progressive_resize_min_size", "160",
                  "--progressive_resize_max_size", "192", "--progressive_resize_end_epoch", "16"},
                 "progressive_resize_end_epoch"},
        BadValue{{"--batch_size", "1", "--progressive_resize_min_size", "32",
                  "--progressive_resize_max_size", "224", "--progressive_resize_end_epoch", "2"},
                 "batch_size"},
        BadValue{{"--data_source", "tfrecord", "--train_data", "/d", "--auto_augment", "autoaug"},
                 "auto_augment"},
        BadValue{{"--randaugment_num_ops", "0"}, "randaugment_num_ops"},
        BadValue{{"--randaugment_num_ops", "17"}, "randaugment_num_ops"},
        BadValue{{"--randaugment_magnitude", "31"}, "randaugment_magnitude"},
        BadValue{{"--randaugment_magnitude", "-1"}, "randaugment_magnitude"},
        BadValue{{"--random_erasing", "1.5"}, "random_erasing"},
        BadValue{{"--random_erasing", "-0.1"}, "random_erasing"},
        // Augmentation happens in the TFRecord decode threads only: elsewhere it would be ignored.
        BadValue{{"--auto_augment", "randaugment"}, "data_source"},
        BadValue{{"--data_source", "generated", "--random_erasing", "0.25"}, "data_source"},
        BadValue{{"--data_source", "tfrecord", "--train_data", "/d", "--train_crop", "bbox"},
                 "train_crop"},
        // The records' boxes exist only in the TFRecord source.
        BadValue{{"--train_crop", "distorted_bounding_box"}, "data_source"}),
    [](const ::testing::TestParamInfo<BadValue>& info) {
      return info.param.key + "_" + std::to_string(info.index);
    });

}  // namespace
}  // namespace trainer
