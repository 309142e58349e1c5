// Chooses where this process computes: the CUDA device given by its local rank, or the CPU.
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace trainer {

// setting: auto | cuda | cpu. "auto" takes the local rank's GPU when any GPU is visible, and
// makes it the calling thread's current device.
// Throws UserError when a GPU is asked for and missing, or the local rank has no GPU of its own.
c10::Device select_device(const std::string& setting, int local_rank);

// Throws UserError when `precision` cannot run on `device` (fp16 on the CPU, bf16 before Ampere).
void check_precision_supported(const std::string& precision, c10::Device device);

// "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)" or "CPU (N threads)".
std::string describe_device(c10::Device device);

}  // namespace trainer
