// bench-max-pool: the stem's max pooling (ResNet-50 at 224 px: 64 channels, 112x112 -> 56x56,
// window 3, stride 2, padding 1, channels_last), ATen's against compact_max_pool2d
// (models/cuda/max_pool.h), forward and backward, on one GPU.
//   bench-max-pool --batch 256 --precision fp16
// It checks the two bit for bit first (values and input gradients), then times each and says
// what the compact kernels move per second against the card's memory bandwidth: the least they
// must move is the input and output once each way, and a byte per output for the places.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>
#include <string>

#include "base/cuda_check.h"
#include "models/cuda/max_pool.h"
#include "src/tools/gpu_timing.h"
#include "src/tools/tool_main.h"

namespace trainer {
namespace {

constexpr int kKernel = 3, kStride = 2, kPadding = 1;
constexpr int64_t kChannels = 64, kSide = 112;

struct Options {
  int64_t batch = 256;
  std::string precision = "fp16";
  int64_t iterations = 50;
};

using Pool = std::function<at::Tensor(const at::Tensor&)>;

struct Times {
  double forward_ms, backward_ms;
};

// Forward alone, then forward and backward (the input gradient, not accumulated).
Times time_pool(const Pool& pool, const at::Tensor& x, const at::Tensor& dy, int64_t iterations) {
  const at::Tensor input = x.detach().requires_grad_(true);
  const double forward = time_ms(iterations, [&] { pool(input); });
  const double step =
      time_ms(iterations, [&] { torch::autograd::grad({pool(input)}, {input}, {dy}); });
  return {forward, step - forward};
}

// Peak memory bandwidth in bytes per second: double data rate over the bus.
double memory_bandwidth() {
  int device = 0, clock_khz = 0, bus_bits = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device));
  return 2.0 * clock_khz * 1e3 * bus_bits / 8.0;
}

// "" when the compact path gives ATen's values and input gradient bit for bit, else what differs.
std::string check(const Pool& aten, const Pool& compact, const at::Tensor& x,
                  const at::Tensor& dy) {
  const at::Tensor a = x.detach().requires_grad_(true), c = x.detach().requires_grad_(true);
  const at::Tensor ya = aten(a), yc = compact(c);
  if (!at::equal(ya, yc)) return "the outputs differ";
  const at::Tensor da = torch::autograd::grad({ya}, {a}, {dy})[0];
  const at::Tensor dc = torch::autograd::grad({yc}, {c}, {dy})[0];
  return at::equal(da, dc) ? "" : "the input gradients differ";
}

int run_benchmark(const Options& o) {
  USER_CHECK(at::cuda::is_available(),
             "no GPU is visible here: run it on a GPU machine (scripts/device/checks.sh fusion)");
  const at::ScalarType dtype = o.precision == "bf16"   ? at::kBFloat16
                               : o.precision == "fp32" ? at::kFloat
                                                       : at::kHalf;
  // After a BN+ReLU: non-negative, with the ReLU's zeros tying many windows; channels_last, as
  // the model's activations.
  const at::Tensor x =
      at::randn({o.batch, kChannels, kSide, kSide}, at::device(at::kCUDA).dtype(dtype))
          .contiguous(at::MemoryFormat::ChannelsLast)
          .relu_();
  const Pool aten = [](const at::Tensor& t) {
    return at::max_pool2d(t, kKernel, kStride, kPadding);
  };
  const Pool compact = [](const at::Tensor& t) {
    return compact_max_pool2d(t, kKernel, kStride, kPadding);
  };
  const at::Tensor dy = at::randn_like(aten(x));
  std::printf(
      "bench-max-pool: %s, batch %lld, %lldx%lldx%lld -> %lldx%lldx%lld, channels_last; %s\n",
      o.precision.c_str(), static_cast<long long>(o.batch), static_cast<long long>(kChannels),
      static_cast<long long>(kSide), static_cast<long long>(kSide),
      static_cast<long long>(kChannels), static_cast<long long>(dy.size(2)),
      static_cast<long long>(dy.size(3)), at::cuda::getCurrentDeviceProperties()->name);
  if (std::string differs = check(aten, compact, x, dy); !differs.empty()) {
    std::printf("compact_max_pool2d is not ATen's: %s\n", differs.c_str());
    return 1;
  }
  const Times a = time_pool(aten, x, dy, o.iterations);
  const Times c = time_pool(compact, x, dy, o.iterations);
  const double in_bytes = static_cast<double>(x.numel() * x.element_size());
  const double out_bytes = static_cast<double>(dy.numel() * dy.element_size());
  const double places = static_cast<double>(dy.numel());
  const double least = 2 * (in_bytes + out_bytes + places);  // forward + backward
  const double seconds = (c.forward_ms + c.backward_ms) / 1e3;
  std::printf(
      "ATen: forward %.3f ms, backward %.3f ms; compact: forward %.3f ms, backward %.3f ms; "
      "%.2fx; the same bits\ncompact moves %.0f GB/s, %.0f%% of the card's %.0f GB/s\n",
      a.forward_ms, a.backward_ms, c.forward_ms, c.backward_ms,
      (a.forward_ms + a.backward_ms) / (c.forward_ms + c.backward_ms), least / seconds / 1e9,
      100.0 * least / seconds / memory_bandwidth(), memory_bandwidth() / 1e9);
  return 0;
}

}  // namespace
}  // namespace trainer

int main(int argc, char** argv) {
  trainer::Options o;
  CLI::App app{"The stem's compact max pooling against ATen's (GPU)", "bench-max-pool"};
  app.add_option("--batch", o.batch, "images per step")->check(CLI::PositiveNumber);
  app.add_option("--precision", o.precision, "fp16, bf16 or fp32")
      ->check(CLI::IsMember({"fp16", "bf16", "fp32"}));
  app.add_option("--iterations", o.iterations, "timed runs of each")->check(CLI::PositiveNumber);
  return trainer::run_tool(app, argc, argv, [&] { return trainer::run_benchmark(o); });
}
