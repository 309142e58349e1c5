// The stem's convolution forms (models/stem.h) compute the plain 7x7/2 convolution: bit for bit
// where the arithmetic is exact (small integers in float32, whatever the order of the additions),
// to float64 rounding otherwise, at every image size the trainer uses (even, odd, progressive
// resizing's), with conv1.weight's gradient in torchvision's shape.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <functional>

#include "models/resnet.h"
#include "models/stem.h"
#include "src/train/autocast.h"

namespace trainer {
namespace {

using StemForm = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>;

torch::Tensor plain_stem_conv(const torch::Tensor& image, const torch::Tensor& weight) {
  return torch::conv2d(image, weight, {}, kStemStride, kStemPadding);
}

// Integers in [-2, 2]: every product and sum of the forward and the weight gradient is exact in
// float32, so any order of additions gives the same bits.
torch::Tensor small_integers(at::IntArrayRef sizes, torch::TensorOptions options = {}) {
  return torch::randint(-2, 3, sizes, options);
}

struct Result {
  torch::Tensor output, weight_grad;
};

Result run(const StemForm& form, const torch::Tensor& image, const torch::Tensor& weight,
           const torch::Tensor& output_grad) {
  const torch::Tensor w = weight.detach().clone().requires_grad_();
  const torch::Tensor y = form(image, w);
  y.backward(output_grad);
  return {y.detach(), w.grad()};
}

const StemForm kSpaceToDepth = space_to_depth_stem_conv;
const StemForm kPaddedTo8 = [](const torch::Tensor& image, const torch::Tensor& weight) {
  return padded_stem_conv(image, weight, 8);
};

TEST(Stem, EachFormIsThePlainConvolutionBitForBitOnExactArithmetic) {
  torch::manual_seed(11);
  // 224 (training), 160 and 192 (progressive resizing), odd sizes, a non-square image.
  const std::vector<std::pair<int64_t, int64_t>> sizes = {
      {224, 224}, {160, 160}, {33, 33}, {35, 48}, {64, 41}};
  for (const auto& [height, width] : sizes)
    for (auto format : {torch::MemoryFormat::Contiguous, torch::MemoryFormat::ChannelsLast})
      for (const auto& [name, form] :
           {std::pair{"space_to_depth", kSpaceToDepth}, std::pair{"padded to 8", kPaddedTo8}}) {
        const torch::Tensor image = small_integers({2, 3, height, width}).contiguous(format);
        const torch::Tensor weight = small_integers({64, 3, 7, 7}).contiguous(format);
        const torch::Tensor output_grad = small_integers(plain_stem_conv(image, weight).sizes());
        const Result plain = run(plain_stem_conv, image, weight, output_grad);
        const Result got = run(form, image, weight, output_grad);
        const std::string where =
            std::string(name) + " at " + std::to_string(height) + "x" + std::to_string(width);
        ASSERT_EQ(got.output.sizes(), plain.output.sizes()) << where;
        EXPECT_TRUE(torch::equal(got.output, plain.output)) << where;
        ASSERT_EQ(got.weight_grad.sizes(), weight.sizes()) << where;
        EXPECT_TRUE(torch::equal(got.weight_grad, plain.weight_grad)) << where;
      }
}

TEST(Stem, SpaceToDepthMatchesThePlainConvolutionInFloat64) {
  torch::manual_seed(12);
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  for (int64_t size : {224, 57}) {
    const torch::Tensor image = torch::randn({3, 3, size, size}, f64);
    const torch::Tensor weight = torch::randn({64, 3, 7, 7}, f64);
    const torch::Tensor output_grad = torch::randn(plain_stem_conv(image, weight).sizes(), f64);
    const Result plain = run(plain_stem_conv, image, weight, output_grad);
    const Result got = run(kSpaceToDepth, image, weight, output_grad);
    EXPECT_TRUE(torch::allclose(got.output, plain.output, 0, 1e-11))
        << (got.output - plain.output).abs().max();
    EXPECT_TRUE(torch::allclose(got.weight_grad, plain.weight_grad, 1e-12, 1e-9))
        << (got.weight_grad - plain.weight_grad).abs().max();
  }
}

// A mutant that pairs the image's blocks with the wrong weight taps (here: the weight not padded
// to 8x8 first, so its taps shift by one) must not pass the bit-for-bit test's comparison.
TEST(Stem, AShiftedWeightIsCaught) {
  torch::manual_seed(13);
  const torch::Tensor image = small_integers({1, 3, 32, 32});
  const torch::Tensor weight = small_integers({64, 3, 7, 7});
  const torch::Tensor shifted = torch::constant_pad_nd(weight, {1, 0, 1, 0});  // 8x8, taps moved
  const torch::Tensor blocks =
      torch::pixel_unshuffle(torch::constant_pad_nd(image, {3, 3, 3, 3, 0, 1}), 2);
  const torch::Tensor wrong = torch::conv2d(
      blocks, torch::pixel_unshuffle(torch::constant_pad_nd(shifted, {0, 0, 0, 0, 0, 1}), 2));
  EXPECT_FALSE(torch::equal(wrong, plain_stem_conv(image, weight)));
  EXPECT_TRUE(
      torch::equal(space_to_depth_stem_conv(image, weight), plain_stem_conv(image, weight)));
}

// On the GPU the model with stem_space_to_depth gives the plain model's logits and gradients, in
// float32 (TF32 off) and under fp16 and bf16 autocast (to their rounding).
TEST(StemGpu, SpaceToDepthModelMatchesThePlainOne) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible to this process";
  // TF32 off for this test, and back as it was however the test ends (an ASSERT returns early).
  struct Tf32Off {
    bool was = at::globalContext().allowTF32CuDNN();
    Tf32Off() { at::globalContext().setAllowTF32CuDNN(false); }
    ~Tf32Off() { at::globalContext().setAllowTF32CuDNN(was); }
  } tf32_off;
  for (const auto dtype : {torch::kFloat32, torch::kFloat16, torch::kBFloat16}) {
    ResNetOptions options{18, 10, false};
    torch::manual_seed(5);
    ResNet plain(options);
    options.stem_space_to_depth = true;
    torch::manual_seed(5);
    ResNet blocks(options);
    for (ResNet* model : {&plain, &blocks}) {
      (*model)->to(torch::kCUDA);
      for (auto& p : (*model)->parameters())  // as the trainer keeps them (channels_last)
        if (p.dim() == 4) p.set_data(p.data().contiguous(torch::MemoryFormat::ChannelsLast));
    }
    const torch::Tensor images =
        torch::randn({8, 3, 96, 96}, torch::kCUDA).contiguous(torch::MemoryFormat::ChannelsLast);
    std::vector<torch::Tensor> logits;
    for (ResNet* model : {&plain, &blocks}) {
      {
        AutocastGuard autocast(torch::kCUDA, dtype == torch::kFloat32
                                                 ? std::nullopt
                                                 : std::optional<at::ScalarType>(dtype));
        logits.push_back((*model)->forward(images).to(torch::kFloat32));
      }
      logits.back().square().mean().backward();
    }
    const double tolerance = dtype == torch::kFloat32   ? 1e-4
                             : dtype == torch::kFloat16 ? 2e-2
                                                        : 1e-1;
    const double scale = logits[0].abs().max().item<double>();
    EXPECT_LE((logits[1] - logits[0]).abs().max().item<double>(), tolerance * scale)
        << c10::toString(dtype);
    const torch::Tensor a = plain->named_parameters()["conv1.weight"].grad();
    const torch::Tensor b = blocks->named_parameters()["conv1.weight"].grad();
    ASSERT_EQ(b.sizes(), a.sizes());
    EXPECT_LE((b - a).abs().max().item<double>(), tolerance * a.abs().max().item<double>())
        << c10::toString(dtype);
  }
}

}  // namespace
}  // namespace trainer
