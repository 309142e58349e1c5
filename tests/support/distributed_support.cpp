#include "tests/support/distributed_support.h"

#include <c10/cuda/CUDAGuard.h>

namespace trainer {

ProcessGroup* g_group = nullptr;

Config dist_config() {
  Config c;
  c.arch = Arch::kResNet18;
  c.num_classes = 4;
  c.data_source = DataSource::kGenerated;
  c.generated_classes = 4;
  c.generated_train_images = 100;  // uneven: not a multiple of ranks x batch
  c.generated_val_images = 41;
  c.image_size = 32;
  c.batch_size = 8;
  c.epochs = 2;
  c.warmup_epochs = 0;
  c.base_lr = 0.1;
  c.log_every_steps = 2;
  c.bucket_mb = 1;  // several buckets even for ResNet-18
  c.world_size = g_group->size();
  validate_config(c);
  return c;
}

Batch batch_for(int index) {
  torch::manual_seed(100 + index);
  return {torch::randint(0, 256, {4, 32, 32, 3}, torch::kByte), torch::randint(0, 4, {4})};
}

std::optional<torch::Device> rank_gpu_with_nccl() {
  const bool has_gpu = torch::cuda::is_available() &&
                       torch::cuda::device_count() >= static_cast<int64_t>(g_group->local_size());
  if (g_group->sum(has_gpu ? 0 : 1) > 0) return std::nullopt;
  const torch::Device device(torch::kCUDA, static_cast<c10::DeviceIndex>(g_group->local_rank()));
  const c10::cuda::CUDAGuard device_guard(device);
  if (!g_group->uses_nccl()) g_group->init_nccl(device);
  return device;
}

}  // namespace trainer
