// The CUDA kernel behind normalize_images (data/transforms/device_input.h), declared without
// LibTorch so that nvcc compiles plain CUDA: out[p, c] = in[p, c] * scale[c] + shift[c] for
// `pixels` RGB pixels.
#pragma once

#include <array>
#include <cstdint>

namespace trainer {

enum class NormalizeOutput { kFloat, kHalf, kBFloat16 };

// Asynchronous on `cuda_stream` (a cudaStream_t); throws std::runtime_error if the launch fails.
void launch_normalize_nhwc(const uint8_t* in, void* out, NormalizeOutput type, int64_t pixels,
                           const std::array<float, 3>& scale, const std::array<float, 3>& shift,
                           void* cuda_stream);

}  // namespace trainer
