// The stem's compact max pooling (models/cuda/max_pool.h). On the CPU: the window arithmetic the
// CUDA kernels run (models/cuda/max_pool_kernel.h) against ATen's max_pool2d_with_indices and its
// backward, on inputs full of ties, -inf and NaN, one channel and a pack of channels at a time;
// and the model's CPU path untouched by the key. On the GPU: the kernels against ATen's, bit for
// bit, values and gradients, every dtype, both kernel widths; the whole model the same with the
// key on and off. The GPU tests skip, with the reason, without a GPU.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "models/cuda/max_pool.h"
#include "models/cuda/max_pool_kernel.h"
#include "models/resnet.h"

namespace trainer {
namespace {

struct Window {
  int kernel, stride, padding;
};

// Windows as max_pool2d allows them (padding at most half the kernel), torchvision's stem first.
const std::vector<Window> kWindows = {{3, 2, 1}, {2, 2, 0}, {3, 1, 1}, {5, 3, 2}, {1, 1, 0}};

// (N, C, H, W) float32 values from {-3, ..., 3}, so windows tie, with some -inf and NaN.
torch::Tensor tied_input(int64_t n, int64_t c, int64_t h, int64_t w) {
  torch::Tensor x = torch::randint(-3, 4, {n, c, h, w}).to(torch::kFloat);
  const torch::Tensor pick = torch::rand({n, c, h, w});
  x.masked_fill_(pick < 0.03, -std::numeric_limits<float>::infinity());
  x.masked_fill_(pick > 0.98, std::numeric_limits<float>::quiet_NaN());
  return x;
}

bool same_values(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && torch::equal(a.isnan(), b.isnan()) &&
         torch::equal(a.nan_to_num(0, 1e30, -1e30), b.nan_to_num(0, 1e30, -1e30));
}

// The kernels' arithmetic on the host: max_of_window and gradient_of_input over every pixel,
// kLanes channels at a time, on (N, H, W, C) float32 tensors.
template <int kLanes>
struct HostPool {
  max_pool::Geometry g;

  // y (N, OH, OW, C) and the places (uint8), from x (N, H, W, C).
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x) const {
    torch::Tensor y = torch::empty({g.batch, g.out_height, g.out_width, g.channels});
    torch::Tensor place = torch::empty(y.sizes(), torch::kByte);
    auto ys = y.accessor<float, 4>();
    auto places = place.accessor<uint8_t, 4>();
    const float* in = x.data_ptr<float>();
    for (int64_t n = 0; n < g.batch; ++n)
      for (int oh = 0; oh < g.out_height; ++oh)
        for (int ow = 0; ow < g.out_width; ++ow)
          for (int64_t c = 0; c < g.channels; c += kLanes) {
            auto load = [&](int ih, int iw, float(&values)[kLanes]) {
              for (int l = 0; l < kLanes; ++l)
                values[l] = in[((n * g.height + ih) * g.width + iw) * g.channels + c + l];
            };
            float best[kLanes];
            uint8_t where[kLanes];
            max_pool::max_of_window<kLanes>(g, oh, ow, load, best, where);
            for (int l = 0; l < kLanes; ++l) {
              ys[n][oh][ow][c + l] = best[l];
              places[n][oh][ow][c + l] = where[l];
            }
          }
    return {y, place};
  }

  // dx (N, H, W, C) from dy and the places (N, OH, OW, C).
  torch::Tensor backward(const torch::Tensor& dy, const torch::Tensor& place) const {
    torch::Tensor dx = torch::empty({g.batch, g.height, g.width, g.channels});
    auto dxs = dx.accessor<float, 4>();
    const float* grad = dy.data_ptr<float>();
    const uint8_t* where = place.data_ptr<uint8_t>();
    for (int64_t n = 0; n < g.batch; ++n)
      for (int ih = 0; ih < g.height; ++ih)
        for (int iw = 0; iw < g.width; ++iw)
          for (int64_t c = 0; c < g.channels; c += kLanes) {
            auto load = [&](int oh, int ow, float(&values)[kLanes], uint8_t(&places)[kLanes]) {
              const int64_t at = ((n * g.out_height + oh) * g.out_width + ow) * g.channels + c;
              for (int l = 0; l < kLanes; ++l) {
                values[l] = grad[at + l];
                places[l] = where[at + l];
              }
            };
            float sum[kLanes];
            max_pool::gradient_of_input<kLanes>(g, ih, iw, load, sum);
            for (int l = 0; l < kLanes; ++l) dxs[n][ih][iw][c + l] = sum[l];
          }
    return dx;
  }
};

torch::Tensor nhwc(const torch::Tensor& nchw) { return nchw.permute({0, 2, 3, 1}).contiguous(); }
torch::Tensor nchw(const torch::Tensor& nhwc) { return nhwc.permute({0, 3, 1, 2}).contiguous(); }

// ATen's flat index (ih * W + iw) of each output's maximum, from its place in the window.
torch::Tensor indices_from_places(const torch::Tensor& place, const max_pool::Geometry& g) {
  torch::Tensor index = torch::empty(place.sizes(), torch::kLong);
  auto places = place.accessor<uint8_t, 4>();
  auto indices = index.accessor<int64_t, 4>();
  for (int64_t n = 0; n < g.batch; ++n)
    for (int oh = 0; oh < g.out_height; ++oh)
      for (int ow = 0; ow < g.out_width; ++ow)
        for (int64_t c = 0; c < g.channels; ++c) {
          const int p = places[n][oh][ow][c];
          const int ih = oh * g.stride - g.padding + p / g.kernel;
          const int iw = ow * g.stride - g.padding + p % g.kernel;
          indices[n][oh][ow][c] = int64_t{ih} * g.width + iw;
        }
  return index;
}

template <int kLanes>
void expect_host_pool_matches_aten(int channels, const Window& w) {
  const int batch = 2, height = 9, width = 8;
  const torch::Tensor x = tied_input(batch, channels, height, width);
  const auto [want_y, want_index] =
      at::max_pool2d_with_indices(x, {w.kernel}, {w.stride}, {w.padding});
  const HostPool<kLanes> pool{
      max_pool::make_geometry(batch, channels, height, width, w.kernel, w.stride, w.padding)};
  const auto [y, place] = pool.forward(nhwc(x));
  SCOPED_TRACE(::testing::Message() << "kernel " << w.kernel << " stride " << w.stride
                                    << " padding " << w.padding << ", " << kLanes << " lanes");
  EXPECT_TRUE(same_values(nchw(y), want_y));
  EXPECT_TRUE(torch::equal(nchw(indices_from_places(place, pool.g)), want_index));

  const torch::Tensor dy = torch::randn(want_y.sizes());
  const torch::Tensor want_dx = at::max_pool2d_with_indices_backward(
      dy, x, {w.kernel}, {w.stride}, {w.padding}, {1}, false, want_index);
  EXPECT_TRUE(torch::equal(nchw(pool.backward(nhwc(dy), place)), want_dx));
}

TEST(MaxPoolWindow, TheKernelsArithmeticIsAtensValuesIndicesAndGradients) {
  torch::manual_seed(7);
  for (const Window& w : kWindows) {
    expect_host_pool_matches_aten<1>(3, w);
    expect_host_pool_matches_aten<4>(8, w);
  }
}

ResNetOptions small_resnet(bool compact) {
  ResNetOptions options;
  options.depth = 18;
  options.num_classes = 10;
  options.compact_max_pool = compact;
  return options;
}

// The logits and every gradient of one forward and backward, with the key on and off.
std::pair<torch::Tensor, std::vector<torch::Tensor>> one_step(bool compact,
                                                              const torch::Tensor& images) {
  torch::manual_seed(3);
  ResNet model(small_resnet(compact));
  model->to(images.device());
  if (images.is_cuda()) {
    for (auto& p : model->parameters())
      if (p.dim() == 4) p.set_data(p.contiguous(at::MemoryFormat::ChannelsLast));
  }
  const torch::Tensor logits = model->forward(images);
  logits.square().sum().backward();
  std::vector<torch::Tensor> grads;
  for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
  return {logits.detach(), grads};
}

void expect_same_step(const torch::Tensor& images) {
  const auto [plain_logits, plain_grads] = one_step(false, images);
  const auto [logits, grads] = one_step(true, images);
  EXPECT_TRUE(torch::equal(logits, plain_logits));
  ASSERT_EQ(grads.size(), plain_grads.size());
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(torch::equal(grads[i], plain_grads[i]));
}

TEST(MaxPoolWindow, OnTheCpuTheModelRunsAtensPooling) {
  torch::manual_seed(5);
  expect_same_step(torch::randn({2, 3, 32, 32}));
}

class MaxPoolGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible to this process";
  }
};

// x laid out channels_last on the GPU, its data `offset` elements into its storage (an offset of
// one breaks the 16-byte alignment the wide kernels need).
torch::Tensor on_gpu(const torch::Tensor& x, at::ScalarType dtype, int64_t offset) {
  const torch::Tensor laid = x.to(torch::kCUDA, dtype).contiguous(at::MemoryFormat::ChannelsLast);
  torch::Tensor storage = torch::empty({laid.numel() + offset}, laid.options());
  torch::Tensor shifted =
      storage.narrow(0, offset, laid.numel()).as_strided(laid.sizes(), laid.strides());
  shifted.copy_(laid);
  return shifted;
}

TEST_F(MaxPoolGpu, MatchesAtenBitForBit) {
  torch::manual_seed(11);
  for (const at::ScalarType dtype : {at::kHalf, at::kBFloat16, at::kFloat}) {
    for (const int64_t channels : {64, 3}) {
      for (const int64_t offset : {0, 1}) {
        for (const bool ties : {true, false}) {
          const torch::Tensor values =
              ties ? tied_input(4, channels, 57, 56) : torch::randn({4, channels, 57, 56});
          const torch::Tensor x = on_gpu(values, dtype, offset).requires_grad_(true);
          ASSERT_TRUE(compact_max_pool_applies(x));
          const torch::Tensor reference = x.detach().clone().requires_grad_(true);
          SCOPED_TRACE(::testing::Message() << dtype << ", " << channels << " channels, offset "
                                            << offset << (ties ? ", ties" : ""));
          const torch::Tensor y = compact_max_pool2d(x, 3, 2, 1);
          const torch::Tensor want = torch::max_pool2d(reference, 3, 2, 1);
          EXPECT_TRUE(same_values(y.detach().to(torch::kFloat).cpu(),
                                  want.detach().to(torch::kFloat).cpu()));
          EXPECT_TRUE(y.is_contiguous(at::MemoryFormat::ChannelsLast));
          const torch::Tensor dy = torch::randn_like(want);
          y.backward(dy);
          want.backward(dy);
          EXPECT_TRUE(torch::equal(x.grad(), reference.grad()));
        }
      }
    }
  }
}

TEST_F(MaxPoolGpu, TheModelStepIsTheSameWithTheKeyOn) {
  const bool deterministic = at::globalContext().deterministicCuDNN();
  const bool benchmark = at::globalContext().benchmarkCuDNN();
  at::globalContext().setDeterministicCuDNN(true);  // the same convolutions both times
  at::globalContext().setBenchmarkCuDNN(false);
  torch::manual_seed(5);
  expect_same_step(
      torch::randn({4, 3, 64, 64}, torch::kCUDA).contiguous(at::MemoryFormat::ChannelsLast));
  at::globalContext().setDeterministicCuDNN(deterministic);
  at::globalContext().setBenchmarkCuDNN(benchmark);
}

}  // namespace
}  // namespace trainer
