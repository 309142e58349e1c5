// ResNet v1.5 (stride 2 on the 3x3 convolution of the bottleneck) for depths 18/34/50/101/152.
// Parameter and buffer names and shapes are identical to torchvision's resnetNN().state_dict(),
// so weights move between this model and torchvision with strict=True.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "models/conv_bn_fusion.h"
#include "models/residual_gradient.h"

namespace trainer {

// How the weights start. torchvision: Kaiming-normal (fan_out) convolutions, the classifier as
// torch's nn.Linear. he_normal_fan_in: the MLPerf TensorFlow 2 reference's (Keras): every
// convolution from he_normal, a normal of stddev sqrt(2 / fan_in) truncated at 2 standard
// deviations and rescaled to keep that stddev; the classifier's weight from N(0, 0.01), its bias 0.
// Both: BN gamma 1, beta 0.
enum class WeightInit { kTorchvision, kHeNormalFanIn };

struct ResNetOptions {
  int depth = 50;              // 18, 34, 50, 101 or 152
  int64_t num_classes = 1000;  // width of the final fully connected layer
  // Zero the last BN gamma of each residual block, so every block starts as the identity
  // (Goyal et al., "Accurate, Large Minibatch SGD"); torchvision's zero_init_residual.
  bool zero_init_residual = false;
  // BlurPool (Zhang, "Making Convolutional Networks Shift-Invariant Again"), as FFCV applies it:
  // a fixed 3x3 binomial blur (depthwise, stride 1) before every strided convolution with 16 or
  // more input channels (the blocks' and the shortcuts'; not the stem). No parameters or buffers
  // are added, so the state dict keeps torchvision's names; checkpoints say the variant.
  bool blurpool = false;
  WeightInit weight_init = WeightInit::kTorchvision;
  // On the GPU, each BN with the ReLU and residual add after it as cuDNN's fused kernels
  // (models/cuda/fused_batch_norm.h); the same ATen ops wherever cuDNN has no fusion.
  bool fused_batch_norm = false;
  // On the GPU, each bottleneck's bn1 and bn2 inside the convolutions around them
  // (models/conv_bn_fusion.h), where cuDNN has the graphs; the plain path elsewhere.
  bool fused_conv_batch_norm = false;
  // On the GPU, each block's input gradient (its first convolution's plus its shortcut's) summed
  // inside that convolution's dgrad (models/residual_gradient.h), where cuDNN has the graph.
  bool fused_residual_gradient = false;
  // The channels the stem's convolution reads: above 3, the image and zero channels, with zero
  // input channels of its weight to match (the parameter stays torchvision's 3). cuDNN's NHWC
  // convolutions want channel counts divisible by 4 or 8 (MLPerf's ResNet-50 pads its input to
  // 4). The same outputs.
  int64_t stem_input_channels = 3;
  // On the GPU, the stem's convolution over 2x2 blocks of pixels, a 4x4 convolution of 16 channels
  // (models/stem.h); stem_input_channels is then unused.
  bool stem_space_to_depth = false;
  // On the GPU, the stem's max pooling as the project's kernels (models/cuda/max_pool.h): ATen's
  // values and gradients, a byte per output kept for backward instead of an int64 index.
  bool compact_max_pool = false;
};

// The blur BlurPool puts before a strided convolution; the filter is made once per device, dtype
// and width (not a buffer: the state dict stays torchvision's).
class Blur {
 public:
  torch::Tensor operator()(const torch::Tensor& x);  // (N, C, H, W) -> same shape

 private:
  torch::Tensor filter_;  // (C, 1, 3, 3) [1 2 1]^T [1 2 1] / 16
};

// Two 3x3 convolutions (ResNet-18/34).
class BasicBlockImpl : public torch::nn::Module {
 public:
  static constexpr int64_t kExpansion = 1;
  // Of `options`, the block reads blurpool and the fused_* switches.
  BasicBlockImpl(int64_t in_channels, int64_t width, int64_t stride,
                 const ResNetOptions& options = {});
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::BatchNorm2d last_bn() { return bn2; }

 private:
  // conv1's output and the block's input for the shortcut (models/residual_gradient.h).
  ConvBesideShortcut first_convolution(const torch::Tensor& input);

  bool blur_;                     // blurpool and strided: blur the inputs of conv1 and the shortcut
  bool fused_;                    // ResNetOptions::fused_batch_norm
  bool residual_gradient_fused_;  // ResNetOptions::fused_residual_gradient
  int64_t stride_;
  Blur blur_input_;
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  torch::nn::Sequential downsample{nullptr};  // 1x1 conv + BN when the shape changes
};
TORCH_MODULE(BasicBlock);

// 1x1 reduce, 3x3 (carrying the stride: v1.5), 1x1 expand by 4 (ResNet-50/101/152).
class BottleneckImpl : public torch::nn::Module {
 public:
  static constexpr int64_t kExpansion = 4;
  // Of `options`, the block reads blurpool and the fused_* switches.
  BottleneckImpl(int64_t in_channels, int64_t width, int64_t stride,
                 const ResNetOptions& options = {});
  torch::Tensor forward(const torch::Tensor& x);
  // The block with bn1 and bn2 inside the convolutions (models/conv_bn_fusion.h), training mode.
  torch::Tensor forward_conv_bn_fused(const torch::Tensor& x, ConvBnBackend backend);
  torch::nn::BatchNorm2d last_bn() { return bn3; }

 private:
  bool cudnn_fusion_ready(const torch::Tensor& x);
  // conv1's output and the block's input for the shortcut (models/residual_gradient.h).
  ConvBesideShortcut first_convolution(const torch::Tensor& x);

  bool blur_;                     // blurpool and strided: blur the inputs of conv2 and the shortcut
  bool fused_;                    // ResNetOptions::fused_batch_norm
  bool conv_fused_;               // ResNetOptions::fused_conv_batch_norm
  bool residual_gradient_fused_;  // ResNetOptions::fused_residual_gradient
  int64_t stride_;
  using ShapeKey = std::tuple<std::array<int64_t, 4>, at::ScalarType, c10::DeviceIndex>;
  std::map<ShapeKey, bool> cudnn_ready_;  // per input shape, dtype and GPU
  Blur blur_input_, blur_mid_;
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr}, bn3{nullptr};
  torch::nn::Sequential downsample{nullptr};
};
TORCH_MODULE(Bottleneck);

class ResNetImpl : public torch::nn::Module {
 public:
  explicit ResNetImpl(const ResNetOptions& options);
  // (N, 3, H, W) float/half, any memory format -> (N, num_classes) logits
  torch::Tensor forward(torch::Tensor x);
  const ResNetOptions& options() const { return options_; }

 private:
  template <typename Block>
  torch::nn::Sequential make_stage(int64_t& in_channels, int64_t width, int blocks, int64_t stride);
  void initialize_weights();
  torch::Tensor stem_convolution(const torch::Tensor& x);  // conv1, padded or not
  torch::Tensor stem_max_pool(const torch::Tensor& x);     // ATen's or compact_max_pool2d

  ResNetOptions options_;
  torch::nn::Conv2d conv1{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr};
  torch::nn::Sequential layer1{nullptr}, layer2{nullptr}, layer3{nullptr}, layer4{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet);

// "resnet50" -> 50; throws UserError naming the allowed architectures otherwise.
int resnet_depth_from_name(const std::string& arch);

}  // namespace trainer
