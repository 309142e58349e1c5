#include "models/resnet.h"

#include <spdlog/spdlog.h>
#include <torch/nn/functional/pooling.h>
#include <torch/nn/init.h>

#include <array>
#include <cmath>
#include <map>

#include "base/user_error.h"
#include "models/cuda/fused_batch_norm.h"
#include "models/cuda/max_pool.h"
#include "models/same_conv.h"
#include "models/stem.h"

namespace trainer {
namespace {

namespace nn = torch::nn;

nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  return nn::Conv2d(
      nn::Conv2dOptions(in, out, kernel).stride(stride).padding(same_padding(kernel)).bias(false));
}

// torchvision's shortcut: 1x1 strided conv + BN, registered as "downsample.0" / "downsample.1".
nn::Sequential make_downsample(int64_t in, int64_t out, int64_t stride) {
  return nn::Sequential(conv(in, out, 1, stride), nn::BatchNorm2d(out));
}

struct DepthSpec {
  bool bottleneck;
  std::array<int, 4> blocks;  // blocks in layer1..layer4
};

const std::map<int, DepthSpec>& depth_specs() {
  static const std::map<int, DepthSpec> specs = {
      {18, {false, {2, 2, 2, 2}}},  {34, {false, {3, 4, 6, 3}}},  {50, {true, {3, 4, 6, 3}}},
      {101, {true, {3, 4, 23, 3}}}, {152, {true, {3, 8, 36, 3}}},
  };
  return specs;
}

// The residual a block adds: the input itself, or the downsample's 1x1 conv + BN of `input` (the
// block's input, blurred when the shortcut is strided and BlurPool is on).
torch::Tensor shortcut(nn::Sequential& downsample, const torch::Tensor& input,
                       const torch::Tensor& x, bool fused) {
  if (!downsample) return x;
  auto* bn = downsample[1]->as<nn::BatchNorm2d>();
  return batch_norm_act(*bn, downsample[0]->as<nn::Conv2d>()->forward(input), {}, /*relu=*/false,
                        fused);
}

// Whether a block sums its input's two gradients inside conv1's dgrad: the key is on and the
// input is an activation the cuDNN graph takes, in a step that computes gradients.
bool residual_gradient_applies(bool fused_residual_gradient, const torch::Tensor& input) {
  return fused_residual_gradient && torch::GradMode::is_enabled() && input.requires_grad() &&
         residual_gradient_fusable(input);
}

// A convolution's weight in the activations' dtype and layout, as autocast hands it to conv2d.
torch::Tensor as_activation(const torch::Tensor& weight, const torch::Tensor& x) {
  return weight.to(x.scalar_type()).contiguous(x.suggest_memory_format());
}

}  // namespace

torch::Tensor Blur::operator()(const torch::Tensor& x) {
  const int64_t channels = x.size(1);
  if (!filter_.defined() || filter_.device() != x.device() || filter_.dtype() != x.dtype() ||
      filter_.size(0) != channels) {
    const torch::Tensor taps = torch::tensor({1.0f, 2.0f, 1.0f});
    filter_ = (taps.unsqueeze(1) * taps.unsqueeze(0) / 16.0)
                  .expand({channels, 1, 3, 3})
                  .contiguous()
                  .to(x.options());
  }
  return torch::conv2d(x, filter_, /*bias=*/{}, /*stride=*/1, same_padding(filter_),
                       /*dilation=*/1, /*groups=*/channels);
}

BasicBlockImpl::BasicBlockImpl(int64_t in_channels, int64_t width, int64_t stride,
                               const ResNetOptions& options)
    : blur_(options.blurpool && stride > 1 && in_channels >= 16),
      fused_(options.fused_batch_norm),
      residual_gradient_fused_(options.fused_residual_gradient),
      stride_(stride) {
  conv1 = register_module("conv1", conv(in_channels, width, 3, stride));
  bn1 = register_module("bn1", nn::BatchNorm2d(width));
  conv2 = register_module("conv2", conv(width, width, 3, 1));
  bn2 = register_module("bn2", nn::BatchNorm2d(width));
  if (stride != 1 || in_channels != width * kExpansion)
    downsample = register_module("downsample", make_downsample(in_channels, width, stride));
}

ConvBesideShortcut BasicBlockImpl::first_convolution(const torch::Tensor& input) {
  if (!residual_gradient_applies(residual_gradient_fused_, input)) return {conv1(input), input};
  return conv_beside_shortcut(input, as_activation(conv1->weight, input), stride_,
                              ConvBnBackend::kCudnn);
}

torch::Tensor BasicBlockImpl::forward(const torch::Tensor& x) {
  // conv1 and the shortcut are strided: both read the blurred input
  const auto [y1, input] = first_convolution(blur_ ? blur_input_(x) : x);
  auto out = batch_norm_act(*bn1, y1, {}, /*relu=*/true, fused_);
  return batch_norm_act(*bn2, conv2(out), shortcut(downsample, input, input, fused_), true, fused_);
}

BottleneckImpl::BottleneckImpl(int64_t in_channels, int64_t width, int64_t stride,
                               const ResNetOptions& options)
    // width >= 64 > 16 input channels: every strided one is blurred
    : blur_(options.blurpool && stride > 1),
      fused_(options.fused_batch_norm),
      conv_fused_(options.fused_conv_batch_norm),
      residual_gradient_fused_(options.fused_residual_gradient),
      stride_(stride) {
  conv1 = register_module("conv1", conv(in_channels, width, 1, 1));
  bn1 = register_module("bn1", nn::BatchNorm2d(width));
  conv2 = register_module("conv2", conv(width, width, 3, stride));  // v1.5: stride here
  bn2 = register_module("bn2", nn::BatchNorm2d(width));
  conv3 = register_module("conv3", conv(width, width * kExpansion, 1, 1));
  bn3 = register_module("bn3", nn::BatchNorm2d(width * kExpansion));
  if (stride != 1 || in_channels != width * kExpansion)
    downsample =
        register_module("downsample", make_downsample(in_channels, width * kExpansion, stride));
}

torch::Tensor BottleneckImpl::forward(const torch::Tensor& x) {
  // The blur sits between bn1's ReLU and conv2, so a blurred block keeps the plain path.
  if (conv_fused_ && is_training() && !blur_ && cudnn_fusion_ready(x))
    return forward_conv_bn_fused(x, ConvBnBackend::kCudnn);
  const auto [y1, input] = first_convolution(x);  // input: x, for the shortcut
  auto out = batch_norm_act(*bn1, y1, {}, /*relu=*/true, fused_);
  // conv2 carries the stride (v1.5)
  out = batch_norm_act(*bn2, conv2(blur_ ? blur_mid_(out) : out), {}, true, fused_);
  const torch::Tensor identity =
      shortcut(downsample, blur_ ? blur_input_(input) : input, input, fused_);
  return batch_norm_act(*bn3, conv3(out), identity, true, fused_);
}

ConvBesideShortcut BottleneckImpl::first_convolution(const torch::Tensor& x) {
  if (!residual_gradient_applies(residual_gradient_fused_, x)) return {conv1(x), x};
  return conv_beside_shortcut(x, as_activation(conv1->weight, x), 1, ConvBnBackend::kCudnn);
}

torch::Tensor BottleneckImpl::forward_conv_bn_fused(const torch::Tensor& x, ConvBnBackend backend) {
  const ConvOutput y1 = conv_with_stats(x, as_activation(conv1->weight, x), 1, backend);
  const ConvOutput y2 =
      bn_relu_conv(*bn1, y1, as_activation(conv2->weight, x), stride_, true, backend);
  const ConvOutput y3 =
      bn_relu_conv(*bn2, y2, as_activation(conv3->weight, x), 1, /*with_stats=*/false, backend);
  return batch_norm_act(*bn3, y3.y, shortcut(downsample, x, x, fused_), true, fused_);
}

// Whether cuDNN's graphs take this input: fp16 or bf16, channels_last, on the GPU, and built for
// its shape (asked once per shape; a shape without them runs the plain path, said once).
bool BottleneckImpl::cudnn_fusion_ready(const torch::Tensor& x) {
  const bool low_precision = x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16;
  if (!x.is_cuda() || !low_precision || x.dim() != 4 ||
      !x.is_contiguous(at::MemoryFormat::ChannelsLast))
    return false;
  // bn2 normalises over conv2's strided output: one value a channel has no variance (the plain
  // path's batch norm says so).
  const int64_t strided = (x.size(2) - 1) / stride_ + 1, strided_w = (x.size(3) - 1) / stride_ + 1;
  if (x.size(0) * strided * strided_w < 2) return false;
  const ShapeKey key{{x.size(0), x.size(1), x.size(2), x.size(3)}, x.scalar_type(), x.get_device()};
  auto [it, first] = cudnn_ready_.emplace(key, false);
  if (!first) return it->second;
  const std::string failure =
      cudnn_bottleneck_failure(x, conv1->weight, conv2->weight, conv3->weight, stride_);
  if (!failure.empty())
    spdlog::warn("fused_conv_batch_norm: a bottleneck on {} {} (GPU {}) runs unfused: {}",
                 c10::str(x.sizes()), c10::toString(x.scalar_type()), x.get_device(), failure);
  return it->second = failure.empty();
}

int resnet_depth_from_name(const std::string& arch) {
  for (const auto& [depth, spec] : depth_specs())
    if (arch == "resnet" + std::to_string(depth)) return depth;
  throw UserError("unknown arch '" + arch +
                  "'; allowed: resnet18, resnet34, resnet50, resnet101, resnet152");
}

ResNetImpl::ResNetImpl(const ResNetOptions& options) : options_(options) {
  auto spec_it = depth_specs().find(options.depth);
  USER_CHECK(spec_it != depth_specs().end(), "ResNet depth ", options.depth,
             " is not one of 18, 34, 50, 101, 152");
  USER_CHECK(options.num_classes > 0, "num_classes must be positive, got ", options.num_classes);
  const DepthSpec& spec = spec_it->second;

  conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(3, 64, kStemKernel)
                                                  .stride(kStemStride)
                                                  .padding(kStemPadding)
                                                  .bias(false)));
  bn1 = register_module("bn1", nn::BatchNorm2d(64));
  int64_t channels = 64;
  const std::array<int64_t, 4> widths = {64, 128, 256, 512};
  std::array<nn::Sequential, 4> stages{nullptr, nullptr, nullptr, nullptr};
  for (int i = 0; i < 4; ++i) {
    const int64_t stride = i == 0 ? 1 : 2;
    stages[i] = spec.bottleneck
                    ? make_stage<Bottleneck>(channels, widths[i], spec.blocks[i], stride)
                    : make_stage<BasicBlock>(channels, widths[i], spec.blocks[i], stride);
  }
  layer1 = register_module("layer1", stages[0]);
  layer2 = register_module("layer2", stages[1]);
  layer3 = register_module("layer3", stages[2]);
  layer4 = register_module("layer4", stages[3]);
  fc = register_module("fc", nn::Linear(channels, options.num_classes));
  initialize_weights();
}

template <typename Block>
nn::Sequential ResNetImpl::make_stage(int64_t& in_channels, int64_t width, int blocks,
                                      int64_t stride) {
  nn::Sequential stage;
  for (int b = 0; b < blocks; ++b) {
    stage->push_back(Block(in_channels, width, b == 0 ? stride : 1, options_));
    in_channels = width * Block::Impl::kExpansion;
  }
  return stage;
}

namespace {

// Keras's truncated normal (tf.random.truncated_normal): N(0, stddev^2) redrawn outside 2
// standard deviations, here by the inverse CDF of a uniform draw between the two bounds' CDFs
// (torch.nn.init.trunc_normal_'s method). Keras's he_normal asks for stddev sqrt(2 / fan_in) /
// 0.87962566103423978, the standard deviation of a unit normal truncated at +-2, so that the
// values' own stddev is sqrt(2 / fan_in).
void he_normal_fan_in_(const torch::Tensor& weight) {
  const int64_t fan_in = weight.numel() / weight.size(0);  // in_channels / groups x kh x kw
  const double stddev = std::sqrt(2.0 / static_cast<double>(fan_in)) / 0.87962566103423978;
  const double bound = std::erf(2.0 / std::sqrt(2.0));  // 2 Phi(2) - 1
  weight.uniform_(-bound, bound).erfinv_().mul_(stddev * std::sqrt(2.0));
  weight.clamp_(-2.0 * stddev, 2.0 * stddev);
}

}  // namespace

// torchvision's initialisation: Kaiming-normal (fan_out) convolutions, BN gamma 1 / beta 0, and the
// default Linear initialisation for fc; or the MLPerf reference's (WeightInit).
void ResNetImpl::initialize_weights() {
  torch::NoGradGuard no_grad;
  const bool keras = options_.weight_init == WeightInit::kHeNormalFanIn;
  for (auto& module : modules(/*include_self=*/false)) {
    if (auto* c = module->as<nn::Conv2d>()) {
      if (keras) {
        he_normal_fan_in_(c->weight);
      } else {
        nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
      }
    } else if (auto* bn = module->as<nn::BatchNorm2d>()) {
      nn::init::ones_(bn->weight);
      nn::init::zeros_(bn->bias);
    }
  }
  if (keras) {  // resnet_model.py: Dense(kernel_initializer=RandomNormal(stddev=0.01)), bias zeros
    nn::init::normal_(fc->weight, 0.0, 0.01);
    nn::init::zeros_(fc->bias);
  }
  if (!options_.zero_init_residual) return;
  for (auto& module : modules(/*include_self=*/false)) {
    if (auto* block = module->as<BottleneckImpl>()) nn::init::zeros_(block->last_bn()->weight);
    if (auto* block = module->as<BasicBlockImpl>()) nn::init::zeros_(block->last_bn()->weight);
  }
}

torch::Tensor ResNetImpl::stem_convolution(const torch::Tensor& x) {
  if (options_.stem_space_to_depth && x.is_cuda())
    return space_to_depth_stem_conv(x, conv1->weight);
  if (options_.stem_input_channels > x.size(1))
    return padded_stem_conv(x, conv1->weight, options_.stem_input_channels);
  return conv1(x);
}

torch::Tensor ResNetImpl::stem_max_pool(const torch::Tensor& x) {
  constexpr int kKernel = 3, kStride = 2, kPadding = 1;
  if (options_.compact_max_pool && compact_max_pool_applies(x))
    return compact_max_pool2d(x, kKernel, kStride, kPadding);
  return torch::max_pool2d(x, kKernel, kStride, kPadding);
}

torch::Tensor ResNetImpl::forward(torch::Tensor x) {
  x = batch_norm_act(*bn1, stem_convolution(x), {}, /*relu=*/true, options_.fused_batch_norm);
  x = stem_max_pool(x);
  x = layer4->forward(layer3->forward(layer2->forward(layer1->forward(x))));
  x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);  // (N, C)
  return fc(x);
}

}  // namespace trainer
