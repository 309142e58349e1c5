// float to and from the activations' element types in the project's CUDA kernels (nvcc only):
// arithmetic in float, values stored as float, __half or __nv_bfloat16, rounded to nearest.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace trainer {

__host__ __device__ inline float to_float(float v) { return v; }
__host__ __device__ inline float to_float(__half v) { return __half2float(v); }
__host__ __device__ inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ T from_float(float v);
template <>
__device__ inline float from_float<float>(float v) {
  return v;
}
template <>
__device__ inline __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

}  // namespace trainer
