// CUDA kernels of models/cuda/max_pool_kernel.h: one thread per output pixel's channel pack
// forward, one per input pixel's pack backward (a gather: no atomics, every dx written once).
// A pack is 16 bytes of channels where the channel count and the pointers allow, one channel
// otherwise. Plain CUDA, no LibTorch headers, so nvcc stays fast.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "base/cuda_check.h"
#include "base/cuda_float.cuh"
#include "models/cuda/max_pool_kernel.h"

namespace trainer::max_pool {
namespace {

template <typename T, int kLanes>
struct alignas(sizeof(T) * kLanes) Pack {
  T v[kLanes];
};

// The forward's load: input pixel (ih, iw) of one image, at one pack of channels.
template <typename T, int kLanes>
struct InputPack {
  const T* image;  // the image's first value, plus the pack's first channel
  int width, channels;
  __host__ __device__ void operator()(int ih, int iw, float (&values)[kLanes]) const {
    const auto pack =
        *reinterpret_cast<const Pack<T, kLanes>*>(image + (ih * width + iw) * channels);
    for (int l = 0; l < kLanes; ++l) values[l] = to_float(pack.v[l]);
  }
};

// The backward's load: output pixel (oh, ow)'s gradient and places, at one pack of channels.
template <typename T, int kLanes>
struct OutputPack {
  const T* dy;
  const uint8_t* place;
  int out_width, channels;
  __host__ __device__ void operator()(int oh, int ow, float (&grad)[kLanes],
                                      uint8_t (&places)[kLanes]) const {
    const int at = (oh * out_width + ow) * channels;
    const auto g = *reinterpret_cast<const Pack<T, kLanes>*>(dy + at);
    const auto p = *reinterpret_cast<const Pack<uint8_t, kLanes>*>(place + at);
    for (int l = 0; l < kLanes; ++l) {
      grad[l] = to_float(g.v[l]);
      places[l] = p.v[l];
    }
  }
};

// Pixel and pack of a flat index over (N, rows, cols, channels / kLanes).
struct PackIndex {
  int n, row, col, channel;
};

__device__ inline PackIndex unflatten(int i, int rows, int cols, int packs_per_pixel, int lanes) {
  const int pixel = i / packs_per_pixel;
  return {pixel / (cols * rows), (pixel / cols) % rows, pixel % cols,
          (i % packs_per_pixel) * lanes};
}

template <typename T, int kLanes>
__global__ void forward_kernel(const T* __restrict__ x, T* __restrict__ y,
                               uint8_t* __restrict__ place, Geometry g, int packs) {
  const int packs_per_pixel = g.channels / kLanes;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < packs; i += gridDim.x * blockDim.x) {
    const PackIndex at = unflatten(i, g.out_height, g.out_width, packs_per_pixel, kLanes);
    const InputPack<T, kLanes> load{x + at.n * g.height * g.width * g.channels + at.channel,
                                    g.width, g.channels};
    float best[kLanes];
    uint8_t where[kLanes];
    max_of_window<kLanes>(g, at.row, at.col, load, best, where);
    Pack<T, kLanes> out;
    Pack<uint8_t, kLanes> places;
    for (int l = 0; l < kLanes; ++l) {
      out.v[l] = from_float<T>(best[l]);  // exact: a value that was loaded, -inf or NaN
      places.v[l] = where[l];
    }
    const int offset = i * kLanes;  // the same (N, OH, OW, C) order as the index
    *reinterpret_cast<Pack<T, kLanes>*>(y + offset) = out;
    *reinterpret_cast<Pack<uint8_t, kLanes>*>(place + offset) = places;
  }
}

template <typename T, int kLanes>
__global__ void backward_kernel(const T* __restrict__ dy, const uint8_t* __restrict__ place,
                                T* __restrict__ dx, Geometry g, int packs) {
  const int packs_per_pixel = g.channels / kLanes;
  const int out_image = g.out_height * g.out_width * g.channels;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < packs; i += gridDim.x * blockDim.x) {
    const PackIndex at = unflatten(i, g.height, g.width, packs_per_pixel, kLanes);
    const int image = at.n * out_image + at.channel;
    const OutputPack<T, kLanes> load{dy + image, place + image, g.out_width, g.channels};
    float grad[kLanes];
    gradient_of_input<kLanes>(g, at.row, at.col, load, grad);
    Pack<T, kLanes> out;
    for (int l = 0; l < kLanes; ++l) out.v[l] = from_float<T>(grad[l]);
    *reinterpret_cast<Pack<T, kLanes>*>(dx + i * kLanes) = out;
  }
}

bool aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

constexpr int kThreads = 256;

// Enough blocks to fill any current GPU; the grid-stride loop covers the rest.
unsigned blocks_for(int packs) {
  constexpr int kMaxBlocks = 1 << 20;
  return static_cast<unsigned>(std::min((packs + kThreads - 1) / kThreads, kMaxBlocks));
}

// Calls body(T{}) for the element type T that `type` names.
template <typename Body>
void for_element(Element type, const Body& body) {
  switch (type) {
    case Element::kFloat:
      return body(float{});
    case Element::kHalf:
      return body(__half{});
    case Element::kBFloat16:
      return body(__nv_bfloat16{});
  }
}

// Calls launch(lanes, packs): 16-byte packs of T where the channel count and every pointer allow
// (`vectors` 16-byte aligned, `place` aligned to its pack), one channel a thread otherwise.
template <typename T, typename Launch>
void in_packs(int elements, int channels, std::initializer_list<const void*> vectors,
              const uint8_t* place, const Launch& launch) {
  constexpr int kWide = 16 / sizeof(T);
  bool wide = channels % kWide == 0 && aligned(place, kWide);
  for (const void* p : vectors) wide = wide && aligned(p, 16);
  if (wide) {
    launch(std::integral_constant<int, kWide>{}, elements / kWide);
  } else {
    launch(std::integral_constant<int, 1>{}, elements);
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void launch_forward(const void* x, void* y, uint8_t* place, Element type, const Geometry& g,
                    void* stream) {
  const int outputs = g.batch * g.out_height * g.out_width * g.channels;
  if (outputs == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  for_element(type, [&](auto zero) {
    using T = decltype(zero);
    in_packs<T>(outputs, g.channels, {x, y}, place, [&](auto lanes, int packs) {
      forward_kernel<T, decltype(lanes)::value><<<blocks_for(packs), kThreads, 0, s>>>(
          static_cast<const T*>(x), static_cast<T*>(y), place, g, packs);
    });
  });
}

void launch_backward(const void* dy, const uint8_t* place, void* dx, Element type,
                     const Geometry& g, void* stream) {
  const int inputs = g.batch * g.height * g.width * g.channels;
  if (inputs == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  for_element(type, [&](auto zero) {
    using T = decltype(zero);
    in_packs<T>(inputs, g.channels, {dy, dx}, place, [&](auto lanes, int packs) {
      backward_kernel<T, decltype(lanes)::value><<<blocks_for(packs), kThreads, 0, s>>>(
          static_cast<const T*>(dy), place, static_cast<T*>(dx), g, packs);
    });
  });
}

}  // namespace trainer::max_pool
