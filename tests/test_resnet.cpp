// The model's structure users rely on: torchvision's parameter names and shapes, its parameter
// count, depth variants and zero-init of residual branches. Numeric parity with torchvision itself
// is tests/test_torchvision_parity.py.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "base/check.h"
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

TEST(ResNet, ForwardGivesLogitsPerImage) {
  ResNet model(ResNetOptions{18, 7, false});
  auto logits = model->forward(torch::randn({2, 3, 64, 64}));
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{2, 7}));
}

TEST(ResNet, UnknownDepthOrArchIsAUserError) {
  EXPECT_THROW(ResNet(ResNetOptions{42, 10, false}), UserError);
  EXPECT_THROW(resnet_depth_from_name("resnet51"), UserError);
  EXPECT_EQ(resnet_depth_from_name("resnet101"), 101);
}

}  // namespace
}  // namespace trainer
