// Chooses where this process computes: the CUDA device given by its local rank, or the CPU.
#pragma once

#include <c10/core/Device.h>

#include <string>

#include "src/config/config.h"

namespace trainer {

// setting: auto | cuda | cpu. "auto" takes the local rank's GPU when any GPU is visible, and
// makes it the calling thread's current device.
// Throws UserError when a GPU is asked for and missing, or the local rank has no GPU of its own.
c10::Device select_device(DeviceChoice choice, int local_rank);

// Throws UserError when a setting cannot run on `device`: fp16 on the CPU, bf16 before Ampere,
// and, in a job a launcher started (`launched`), gradients compressed on the wire without GPUs.
void check_device_supports(const Config& config, c10::Device device, bool launched);

// Caps what LibTorch's allocator may take on `device` at `gib` GiB (gpu_memory_gib): past it an
// allocation fails as on a card of that size, so a run on a large card shows whether the same
// run fits a smaller one (a 16 GB V100: 15). 0, the CPU, or a cap above the card: no cap.
void limit_gpu_memory(c10::Device device, double gib);

// "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)" or "CPU (N threads)".
std::string describe_device(c10::Device device);

}  // namespace trainer
