// CUDA kernel of data/transforms/normalize_kernel.h: fused uint8 -> normalised float/half/bfloat16,
// one pixel per thread. Plain CUDA, no LibTorch headers, so nvcc stays fast.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <array>

#include "base/cuda_check.h"
#include "base/cuda_float.cuh"
#include "data/transforms/normalize_kernel.h"

namespace trainer {
namespace {

struct Affine3 {
  float scale[3];
  float shift[3];
};

template <typename T>
__global__ void normalize_nhwc_kernel(const uint8_t* __restrict__ in, T* __restrict__ out,
                                      int64_t pixels, Affine3 affine) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < pixels;
       p += stride) {
#pragma unroll
    for (int c = 0; c < 3; ++c)
      out[3 * p + c] = from_float<T>(in[3 * p + c] * affine.scale[c] + affine.shift[c]);
  }
}

template <typename T>
void launch(const uint8_t* in, void* out, int64_t pixels, const Affine3& affine,
            cudaStream_t stream) {
  constexpr int kThreads = 256;
  // Enough blocks to fill any current GPU; the grid-stride loop covers the rest.
  const int64_t blocks = std::min<int64_t>((pixels + kThreads - 1) / kThreads, 65536);
  normalize_nhwc_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      in, static_cast<T*>(out), pixels, affine);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void launch_normalize_nhwc(const uint8_t* in, void* out, NormalizeOutput type, int64_t pixels,
                           const std::array<float, 3>& scale, const std::array<float, 3>& shift,
                           void* cuda_stream) {
  if (pixels == 0) return;
  Affine3 affine{{scale[0], scale[1], scale[2]}, {shift[0], shift[1], shift[2]}};
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  switch (type) {
    case NormalizeOutput::kFloat:
      return launch<float>(in, out, pixels, affine, stream);
    case NormalizeOutput::kHalf:
      return launch<__half>(in, out, pixels, affine, stream);
    case NormalizeOutput::kBFloat16:
      return launch<__nv_bfloat16>(in, out, pixels, affine, stream);
  }
}

}  // namespace trainer
