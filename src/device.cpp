#include "src/device.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#include <spdlog/spdlog.h>
#include <torch/cuda.h>

#include <cstdio>

#include "base/cuda_check.h"

namespace trainer {

c10::Device select_device(DeviceChoice choice, int local_rank) {
  if (choice == DeviceChoice::kCpu) return c10::Device(c10::kCPU);
  const int gpus = static_cast<int>(torch::cuda::device_count());
  if (choice == DeviceChoice::kAuto && gpus == 0) return c10::Device(c10::kCPU);
  USER_CHECK(gpus > 0, "device = cuda but no CUDA device is visible to this process. Fix: run on ",
             "a GPU node (Kubernetes: request nvidia.com/gpu; Docker: --gpus), check ",
             "CUDA_VISIBLE_DEVICES and nvidia-smi, or set device = cpu");
  USER_CHECK(local_rank < gpus, "local rank ", local_rank, " has no GPU: only ", gpus,
             " visible on this node. Fix: start at most ", gpus,
             " processes per node (mpirun --map-by slot with slots = GPUs per node)");
  // The current device of this thread, too: CUDA events, streams and NCCL calls made without a
  // tensor to guide them (the benchmark's timers, the reducer's events) land on this GPU.
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(local_rank));
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
}

void check_device_supports(const Config& c, c10::Device device, bool launched) {
  USER_CHECK(!launched || c.grad_compression == GradCompression::kNone || device.is_cuda(),
             "grad_compression = ", name_of(c.grad_compression),
             " needs GPUs (NCCL); on the CPU set grad_compression = none");
  if (device.is_cpu()) {
    USER_CHECK(c.precision != Precision::kFp16,
               "precision = fp16 needs a GPU; this run is on the CPU. Fix: ",
               "precision = fp32 (or bf16) on the CPU, or device = cuda on a GPU node");
    return;
  }
  if (c.precision != Precision::kBf16) return;
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device.index()));
  USER_CHECK(prop.major >= 8, "precision = bf16 needs an Ampere or newer GPU; ", prop.name,
             " is sm_", prop.major, prop.minor, ". Fix: precision = fp16 (V100, T4)");
}

void limit_gpu_memory(c10::Device device, double gib) {
  if (gib <= 0 || !device.is_cuda()) return;
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device.index()));
  const double card = static_cast<double>(prop.totalGlobalMem);  // what the allocator's cap is of
  const double limit = gib * static_cast<double>(1ull << 30);
  if (limit >= card) {
    spdlog::warn("gpu_memory_gib = {} is not below the card's {:.1f} GiB: no cap", gib,
                 card / static_cast<double>(1ull << 30));
    return;
  }
  // LibTorch makes its CUDA allocator at the first CUDA tensor; a cap set before that throws
  // "Allocator not initialized", so CUDA's lazy set-up runs first (as PyTorch's
  // torch.cuda.set_per_process_memory_fraction does).
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
  c10::cuda::CUDACachingAllocator::setMemoryFraction(limit / card, device.index());
  spdlog::info(
      "GPU memory: LibTorch's allocator may take {} GiB of the card's {:.1f} "
      "(gpu_memory_gib)",
      gib, card / static_cast<double>(1ull << 30));
}

std::string describe_device(c10::Device device) {
  if (device.is_cpu()) return "CPU (" + std::to_string(at::get_num_threads()) + " threads)";
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device.index()));
  char text[384];
  std::snprintf(text, sizeof(text), "cuda:%d %s (sm_%d%d, %.1f GiB)", device.index(), prop.name,
                prop.major, prop.minor, prop.totalGlobalMem / double(1ull << 30));
  return text;
}

}  // namespace trainer
