// Max pooling over channels_last activations without ATen's int64 index per output: the forward
// keeps the place of each maximum in its window as one byte, and the backward gathers each input's
// gradient from the windows that hold it. ATen's forward writes eight bytes of index beside each
// two-byte fp16 output, and its backward reads them again: for ResNet-50's stem at batch 256 that
// is 411 MB each way, more than the pooled activation itself.
//
// The window arithmetic is here, shared by the CUDA kernels (max_pool_kernel.cu) and the CPU
// tests that check it against ATen's max_pool2d_with_indices. Plain C++ and CUDA, no LibTorch.
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define TRAINER_HOST_DEVICE __host__ __device__
#else
#define TRAINER_HOST_DEVICE
#endif

namespace trainer::max_pool {

// An (N, H, W, C) input pooled by a square `kernel` at `stride` with `padding` on every side, as
// max_pool2d with dilation 1 and ceil_mode false: the output is (N, out_height, out_width, C).
// The kernels index in 32 bits: input and output hold at most kMaxValues values each.
struct Geometry {
  int batch = 0, channels = 0;
  int height = 0, width = 0, out_height = 0, out_width = 0;
  int kernel = 0, stride = 0, padding = 0;
};

// The kernel's kernel x kernel places fit a byte.
constexpr int kMaxKernel = 15;
// 2^30: an index plus a grid's stride stays below 2^31.
constexpr int64_t kMaxValues = int64_t{1} << 30;

inline Geometry make_geometry(int batch, int channels, int height, int width, int kernel,
                              int stride, int padding) {
  auto out = [&](int in) { return (in + 2 * padding - kernel) / stride + 1; };
  return {batch, channels, height, width, out(height), out(width), kernel, stride, padding};
}

struct Span {
  int begin, end;  // [begin, end)
};

// The input rows (or columns) that output row `out`'s window reads: the window clipped to the
// input, as ATen reads it.
TRAINER_HOST_DEVICE inline Span window(int out, int stride, int padding, int kernel, int size) {
  const int start = out * stride - padding;
  return {start < 0 ? 0 : start, start + kernel < size ? start + kernel : size};
}

// The output rows (or columns) whose windows hold input row `in` (ATen's p_start and p_end).
TRAINER_HOST_DEVICE inline Span windows_holding(int in, int stride, int padding, int kernel,
                                                int out_size) {
  const int begin = in + padding < kernel ? 0 : (in + padding - kernel) / stride + 1;
  const int end = (in + padding) / stride + 1;
  return {begin, end < out_size ? end : out_size};
}

// Where input (ih, iw) sits in output (oh, ow)'s window, row-major over the unclipped window.
TRAINER_HOST_DEVICE inline uint8_t place_in_window(const Geometry& g, int ih, int iw, int oh,
                                                   int ow) {
  return static_cast<uint8_t>((ih - (oh * g.stride - g.padding)) * g.kernel +
                              (iw - (ow * g.stride - g.padding)));
}

// One output pixel's maximum and its place, kLanes channels at once; load(ih, iw, values) reads
// input pixel (ih, iw)'s lanes as float. The choice is ATen's: the first largest value in
// row-major order, and a NaN wins over any number (the last NaN), so the values, and the
// gradients that follow the places, are ATen's bit for bit. One difference: a window of nothing
// but -inf gives its gradient to its first value, as ATen's CPU and NCHW kernels do, where
// ATen's channels_last CUDA kernel records index 0 and drops it (a ReLU's output has no -inf).
template <int kLanes, typename Load>
TRAINER_HOST_DEVICE void max_of_window(const Geometry& g, int oh, int ow, const Load& load,
                                       float (&best)[kLanes], uint8_t (&place)[kLanes]) {
  const Span rows = window(oh, g.stride, g.padding, g.kernel, g.height);
  const Span cols = window(ow, g.stride, g.padding, g.kernel, g.width);
  const uint8_t first = place_in_window(g, rows.begin, cols.begin, oh, ow);
  for (int l = 0; l < kLanes; ++l) {
    best[l] = -INFINITY;
    place[l] = first;
  }
  for (int ih = rows.begin; ih < rows.end; ++ih) {
    for (int iw = cols.begin; iw < cols.end; ++iw) {
      float values[kLanes];
      load(ih, iw, values);
      const uint8_t here = place_in_window(g, ih, iw, oh, ow);
      for (int l = 0; l < kLanes; ++l) {
        // values[l] != values[l]: NaN, without a math library that differs on host and device.
        if (values[l] > best[l] || values[l] != values[l]) {
          best[l] = values[l];
          place[l] = here;
        }
      }
    }
  }
}

// One input pixel's gradient, kLanes channels at once: the sum, in float and in ATen's order
// (output row, then column), of the output gradients whose maximum it was. load(oh, ow, dy,
// places) reads output pixel (oh, ow)'s gradients as float and its places.
template <int kLanes, typename Load>
TRAINER_HOST_DEVICE void gradient_of_input(const Geometry& g, int ih, int iw, const Load& load,
                                           float (&grad)[kLanes]) {
  const Span rows = windows_holding(ih, g.stride, g.padding, g.kernel, g.out_height);
  const Span cols = windows_holding(iw, g.stride, g.padding, g.kernel, g.out_width);
  for (int l = 0; l < kLanes; ++l) grad[l] = 0.0f;
  for (int oh = rows.begin; oh < rows.end; ++oh) {
    for (int ow = cols.begin; ow < cols.end; ++ow) {
      float dy[kLanes];
      uint8_t places[kLanes];
      load(oh, ow, dy, places);
      const uint8_t here = place_in_window(g, ih, iw, oh, ow);
      for (int l = 0; l < kLanes; ++l)
        if (places[l] == here) grad[l] += dy[l];
    }
  }
}

enum class Element { kFloat, kHalf, kBFloat16 };

// x: (N, H, W, C); y and place: (N, out_height, out_width, C). On `stream`, a cudaStream_t.
void launch_forward(const void* x, void* y, uint8_t* place, Element type, const Geometry& g,
                    void* stream);

// dy and place: (N, out_height, out_width, C); dx: (N, H, W, C), every value written.
void launch_backward(const void* dy, const uint8_t* place, void* dx, Element type,
                     const Geometry& g, void* stream);

}  // namespace trainer::max_pool
