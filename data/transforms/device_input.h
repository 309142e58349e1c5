// Normalisation on the device: a uint8 NHWC batch becomes the network's input,
// (x / 255 - mean) / std per channel, as (N, 3, H, W) in the compute dtype. NHWC bytes permuted to
// NCHW are exactly the channels_last layout, so the GPU path writes channels_last with no copy.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/MemoryFormat.h>

#include <array>

namespace trainer {

struct Normalization {
  std::array<float, 3> mean = {0.485f, 0.456f, 0.406f};  // ImageNet RGB mean, in [0, 1] units
  std::array<float, 3> std = {0.229f, 0.224f, 0.225f};   // ImageNet RGB standard deviation
};

// images: (N, H, W, 3) uint8 on the device that will run the model (CPU or CUDA).
// Returns (N, 3, H, W) of `dtype` (float, half or bfloat16) in `memory_format`.
at::Tensor normalize_images(const at::Tensor& images, at::ScalarType dtype,
                            c10::MemoryFormat memory_format, const Normalization& norm = {});

}  // namespace trainer
