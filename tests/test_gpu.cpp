// GPU paths: the normalisation kernel against the CPU reference, bf16 and fp16 training steps in
// channels_last, and fp16 loss scaling on real overflow. Skipped, with the reason, without a GPU.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "data/transforms/device_input.h"
#include "src/part_options.h"
#include "src/sources.h"
#include "src/train/trainer.h"

namespace trainer {
namespace {

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible to this process";
  }
};

Config gpu_config(Precision precision) {
  Config c;
  c.arch = Arch::kResNet18;
  c.num_classes = 4;
  c.data_source = DataSource::kGenerated;
  c.generated_classes = 4;
  c.generated_train_images = 256;
  c.generated_val_images = 64;
  c.image_size = 64;
  c.batch_size = 32;
  c.epochs = 4;
  c.warmup_epochs = 1;
  c.base_lr = 0.4;
  c.precision = precision;
  c.device = DeviceChoice::kCuda;
  validate_config(c);
  return c;
}

TEST_F(Gpu, NormalizeKernelMatchesCpuReference) {
  auto images = torch::randint(0, 256, {3, 17, 19, 3}, torch::kByte);
  for (auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    auto cpu = normalize_images(images, torch::kFloat, c10::MemoryFormat::Contiguous);
    auto gpu = normalize_images(images.cuda(), dtype, c10::MemoryFormat::ChannelsLast);
    EXPECT_TRUE(gpu.is_contiguous(c10::MemoryFormat::ChannelsLast));
    EXPECT_EQ(gpu.scalar_type(), dtype);
    const double tol = dtype == torch::kFloat ? 1e-6 : 2e-2;
    EXPECT_TRUE(torch::allclose(gpu.cpu().to(torch::kFloat), cpu, tol, tol)) << dtype;
  }
}

void expect_learns(Precision precision) {
  Config c = gpu_config(precision);
  Sources sources = make_sources(c, torch::Device(torch::kCUDA, 0));
  Trainer trainer(trainer_options(c), torch::Device(torch::kCUDA, 0));
  for (const auto& p : trainer.model()->parameters())
    if (p.dim() == 4) EXPECT_TRUE(p.is_contiguous(c10::MemoryFormat::ChannelsLast));
  std::vector<double> losses;
  for (int64_t epoch = 0; epoch < c.epochs; ++epoch) {
    sources.train->start_epoch(epoch);
    while (sources.train->batches_left() > 0)
      losses.push_back(trainer.train_step(sources.train->next_batch(), 0.05).item<double>());
  }
  EXPECT_LT(losses.back(), 0.5 * losses.front()) << name_of(precision);
  EXPECT_GT(trainer.evaluate(*sources.val).top1(), 60.0) << name_of(precision);
}

TEST_F(Gpu, Bf16StepsLearnInChannelsLast) { expect_learns(Precision::kBf16); }

TEST_F(Gpu, Fp16StepsLearnInChannelsLast) { expect_learns(Precision::kFp16); }

TEST_F(Gpu, Fp16OverflowSkipsStepsAndHalvesTheScale) {
  Config c = gpu_config(Precision::kFp16);
  c.loss_scale_init = 1e30;  // fp16 gradients overflow at this scale
  Sources sources = make_sources(c, torch::Device(torch::kCUDA, 0));
  Trainer trainer(trainer_options(c), torch::Device(torch::kCUDA, 0));
  auto before = trainer.model()->named_parameters()["conv1.weight"].clone();
  sources.train->start_epoch(0);
  trainer.train_step(sources.train->next_batch(), 0.1);
  EXPECT_TRUE(torch::equal(trainer.model()->named_parameters()["conv1.weight"], before));
  EXPECT_EQ(trainer.loss_scaler().scale_value(), static_cast<double>(1e30f) * 0.5);
}

}  // namespace
}  // namespace trainer
