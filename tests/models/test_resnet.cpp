// The model's structure users rely on: torchvision's parameter names and shapes, its parameter
// count, depth variants and zero-init of residual branches. Numeric parity with torchvision itself
// is tests/models/test_torchvision_parity.py.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "base/user_error.h"
#include "models/resnet.h"

namespace trainer {
namespace {

int64_t count_parameters(ResNet& model) {
  int64_t n = 0;
  for (const auto& p : model->parameters()) n += p.numel();
  return n;
}

TEST(ResNet, Resnet50HasTorchvisionParameterCount) {
  ResNet model(ResNetOptions{50, 1000, false});
  EXPECT_EQ(count_parameters(model), 25557032);
}

TEST(ResNet, DepthsHaveTorchvisionParameterCounts) {
  // torchvision.models.resnetNN().parameters() summed, at 1000 classes.
  const std::vector<std::pair<int, int64_t>> expected = {
      {18, 11689512}, {34, 21797672}, {101, 44549160}, {152, 60192808}};
  for (const auto& [depth, count] : expected) {
    ResNet model(ResNetOptions{depth, 1000, false});
    EXPECT_EQ(count_parameters(model), count) << "resnet" << depth;
  }
}

TEST(ResNet, Resnet50NamesAndShapesMatchTorchvision) {
  ResNet model(ResNetOptions{50, 10, false});
  auto params = model->named_parameters();
  auto buffers = model->named_buffers();
  EXPECT_EQ(params.size(), 161u);   // len(list(resnet50().parameters()))
  EXPECT_EQ(buffers.size(), 159u);  // 53 BN layers x (running_mean, running_var, batches)
  EXPECT_EQ(params["conv1.weight"].sizes(), (std::vector<int64_t>{64, 3, 7, 7}));
  // v1.5: the stride sits on the 3x3 convolution of the first block of a stage.
  EXPECT_EQ(params["layer2.0.conv2.weight"].sizes(), (std::vector<int64_t>{128, 128, 3, 3}));
  EXPECT_EQ(params["layer2.0.downsample.0.weight"].sizes(), (std::vector<int64_t>{512, 256, 1, 1}));
  EXPECT_TRUE(params.contains("layer4.2.bn3.bias"));
  EXPECT_TRUE(buffers.contains("layer3.5.bn2.num_batches_tracked"));
  EXPECT_EQ(params["fc.weight"].sizes(), (std::vector<int64_t>{10, 2048}));
}

TEST(ResNet, StrideTwoOnTheThreeByThreeConvolution) {
  ResNet model(ResNetOptions{50, 10, false});
  for (auto& item : model->named_modules()) {
    if (item.key() == "layer3.0.conv1")
      EXPECT_EQ(item.value()->as<torch::nn::Conv2d>()->options.stride()->at(0), 1);
    if (item.key() == "layer3.0.conv2")
      EXPECT_EQ(item.value()->as<torch::nn::Conv2d>()->options.stride()->at(0), 2);
  }
}

TEST(ResNet, ZeroInitResidualZeroesLastBnGammaOnly) {
  ResNet zeroed(ResNetOptions{50, 10, true});
  auto params = zeroed->named_parameters();
  EXPECT_EQ(params["layer1.0.bn3.weight"].abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(params["layer4.2.bn3.weight"].abs().sum().item<float>(), 0.0f);
  EXPECT_TRUE(params["layer1.0.bn2.weight"].eq(1).all().item<bool>());
  ResNet basic(ResNetOptions{18, 10, true});
  EXPECT_EQ(basic->named_parameters()["layer2.1.bn2.weight"].abs().sum().item<float>(), 0.0f);
  ResNet plain(ResNetOptions{50, 10, false});
  EXPECT_TRUE(plain->named_parameters()["layer1.0.bn3.weight"].eq(1).all().item<bool>());
}

// Each convolution's weights against its initialisation's standard deviation: torchvision's
// Kaiming normal sqrt(2 / fan_out), or the MLPerf reference's Keras he_normal, sqrt(2 / fan_in)
// after truncation at 2 standard deviations of the untruncated normal (sqrt(2 / fan_in) /
// 0.8796...), which no value passes. fan_in = in_channels x kh x kw, fan_out = out_channels x kh x
// kw; the 1x1 and 3x3 layers of ResNet-50 have them differ by 4x, the stem by 64 / 3.
TEST(ResNet, WeightInitGivesEachConvolutionItsStandardDeviation) {
  for (const WeightInit init : {WeightInit::kTorchvision, WeightInit::kHeNormalFanIn}) {
    torch::manual_seed(3);
    ResNet model(ResNetOptions{50, 1000, false, false, init});
    const bool keras = init == WeightInit::kHeNormalFanIn;
    int convolutions = 0;
    for (const auto& item : model->named_parameters()) {
      const torch::Tensor& w = item.value();
      if (w.dim() != 4) continue;
      ++convolutions;
      const double receptive = static_cast<double>(w.size(2) * w.size(3));
      const double fan = (keras ? w.size(1) : w.size(0)) * receptive;
      const double expected = std::sqrt(2.0 / fan);
      // The sample's stddev: ~1/sqrt(2n) relative error; the smallest layer has 4,096 weights.
      const double tolerance = 4.0 / std::sqrt(2.0 * static_cast<double>(w.numel()));
      EXPECT_NEAR(w.std().item<double>() / expected, 1.0, tolerance) << item.key();
      EXPECT_NEAR(w.mean().item<double>() / expected, 0.0, 2 * tolerance) << item.key();
      const double largest = w.abs().max().item<double>() / expected;
      if (keras) {
        EXPECT_LE(largest, 2.0 / 0.87962566103423978 + 1e-6) << item.key();
      } else if (w.numel() > 100000) {
        EXPECT_GT(largest, 2.0 / 0.87962566103423978) << item.key();  // untruncated tails
      }
    }
    EXPECT_EQ(convolutions, 53);
    const torch::Tensor fc_weight = model->named_parameters()["fc.weight"];
    const torch::Tensor fc_bias = model->named_parameters()["fc.bias"];
    if (keras) {
      EXPECT_NEAR(fc_weight.std().item<double>(), 0.01, 0.0002);
      EXPECT_EQ(fc_bias.abs().max().item<float>(), 0.0f);
    } else {  // nn.Linear: uniform in +-1/sqrt(2048), stddev 1/sqrt(3 x 2048)
      EXPECT_NEAR(fc_weight.std().item<double>(), 1.0 / std::sqrt(3.0 * 2048), 0.0002);
      EXPECT_GT(fc_bias.abs().max().item<float>(), 0.0f);
    }
    for (const auto& item : model->named_parameters()) {
      if (item.key().find("bn") == std::string::npos &&
          item.key().find("downsample.1") == std::string::npos)
        continue;
      const bool gamma = item.key().rfind(".weight") == item.key().size() - 7;
      const float value = gamma ? 1.0f : 0.0f;
      EXPECT_TRUE(item.value().eq(value).all().item<bool>()) << item.key();
    }
  }
  ResNet zeroed(ResNetOptions{50, 10, true, false, WeightInit::kHeNormalFanIn});
  EXPECT_EQ(zeroed->named_parameters()["layer1.0.bn3.weight"].abs().sum().item<float>(), 0.0f);
}

TEST(ResNet, ForwardGivesLogitsPerImage) {
  ResNet model(ResNetOptions{18, 7, false});
  auto logits = model->forward(torch::randn({2, 3, 64, 64}));
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{2, 7}));
}

// stem_input_channels changes how conv1 runs, not what it computes: the same logits and gradients
// in either memory layout and at 4 and 8 channels, and the same state dict (conv1 keeps
// torchvision's 3 input channels).
TEST(ResNet, PaddedStemGivesTheSameLogitsGradientsAndStateDict) {
  for (const int64_t channels : {4, 8})
    for (auto format : {torch::MemoryFormat::Contiguous, torch::MemoryFormat::ChannelsLast}) {
      ResNetOptions options{18, 5, false};
      torch::manual_seed(3);
      ResNet plain(options);
      options.stem_input_channels = channels;
      torch::manual_seed(3);
      ResNet padded(options);
      torch::manual_seed(4);
      const torch::Tensor images = torch::randn({2, 3, 40, 40}).contiguous(format);
      const torch::Tensor want = plain->forward(images), got = padded->forward(images);
      EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-5)) << (got - want).abs().max();
      want.square().sum().backward();
      got.square().sum().backward();
      auto expected = plain->named_parameters();
      for (const auto& item : padded->named_parameters()) {
        EXPECT_EQ(item.value().sizes(), expected[item.key()].sizes()) << item.key();
        const torch::Tensor& a = item.value().grad();
        const torch::Tensor& b = expected[item.key()].grad();
        EXPECT_TRUE(torch::allclose(a, b, 1e-4, 1e-5 * b.abs().max().item<double>()))
            << item.key() << " " << (a - b).abs().max();
      }
    }
}

TEST(ResNet, UnknownDepthOrArchIsAUserError) {
  EXPECT_THROW(ResNet(ResNetOptions{42, 10, false}), UserError);
  EXPECT_THROW(resnet_depth_from_name("resnet51"), UserError);
  EXPECT_EQ(resnet_depth_from_name("resnet101"), 101);
}

}  // namespace
}  // namespace trainer
