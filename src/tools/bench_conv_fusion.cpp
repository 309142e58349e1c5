// bench-conv-fusion: whether cuDNN fuses ResNet-50's convolutions with the batch norm around them
// on this GPU, whether the fusion computes what the trainer's path does, and what it would save,
// before it is built into the model.
//   bench-conv-fusion --batch 256 --precision fp16
// For each bottleneck convolution that reads a BN+ReLU (each block's 3x3 and its last 1x1), at
// 224 px, it times the trainer's path today (cuDNN's BN+ReLU kernel, then the convolution;
// autograd's backward through both) against the convolution-side fusion of NVIDIA's MLPerf
// ResNet-50 as the model runs it with fused_conv_batch_norm (models/conv_bn_fusion.h): the BN's
// scale and bias from its input's sums and scale-bias-ReLU-conv-genstats forward,
// dgrad-dReLU-dBN-weight, scale-bias-ReLU-wgrad and one element-wise pass backward. It checks the
// fused forward against ATen in float32 and the fused gradients against float32 autograd, each no
// further off than today's path in the same dtype; and says which graphs cuDNN cannot build here,
// with cuDNN's reason.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <cudnn.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>

#include "base/user_error.h"
#include "models/conv_bn_fusion.h"
#include "models/cuda/conv_bn_graphs.h"
#include "models/cuda/fused_batch_norm.h"
#include "src/tools/gpu_timing.h"
#include "src/tools/tool_main.h"

namespace trainer {
namespace {

// A convolution of ResNet-50 that reads a BN+ReLU, at 224 px and stride 1 (the first block of
// layers 2-4 has its 3x3 at stride 2 on twice the side: timed here as the others).
struct ConvShape {
  const char* name;
  int64_t c, k, r, side;  // input and output channels, kernel side, activation side
  int64_t count;          // such convolutions in the model
};

constexpr ConvShape kShapes[] = {
    {"layer1 3x3", 64, 64, 3, 56, 3},   {"layer1 1x1", 64, 256, 1, 56, 3},
    {"layer2 3x3", 128, 128, 3, 28, 4}, {"layer2 1x1", 128, 512, 1, 28, 4},
    {"layer3 3x3", 256, 256, 3, 14, 6}, {"layer3 1x1", 256, 1024, 1, 14, 6},
    {"layer4 3x3", 512, 512, 3, 7, 3},  {"layer4 1x1", 512, 2048, 1, 7, 3},
};

struct Options {
  int64_t batch = 256;
  std::string precision = "fp16";
  int64_t iterations = 20;
  bool cudnn_benchmark = true;  // as the trainer's default: ATen's and the fused graphs' autotuning
};

// Largest absolute difference over the largest absolute reference value.
double relative_error(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor reference = want.to(at::kDouble);
  return (got.to(at::kDouble) - reference).abs().max().item<double>() /
         std::max(reference.abs().max().item<double>(), 1e-30);
}

// The tensors of one shape: the convolution's pre-BN input, its weights, the BN's parameters and
// statistics, and an output gradient.
struct Layer {
  ConvShape shape;
  int64_t n;
  at::Tensor x, w, dy;     // io dtype, channels_last
  at::Tensor gamma, beta;  // float32 (C)
  at::Tensor running_mean, running_var;
  at::Tensor sum, sq_sum;  // float32 (C): the x sums a previous epilogue would write
  int64_t pad() const { return shape.r / 2; }
  int64_t count() const { return n * shape.side * shape.side; }  // values a channel
};

Layer make_layer(const ConvShape& shape, int64_t n, at::ScalarType dtype) {
  const auto cuda = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  const auto channels_last = c10::MemoryFormat::ChannelsLast;
  Layer l{shape, n};
  l.x = (at::randn({n, shape.c, shape.side, shape.side}, cuda) * 2 + 0.5)
            .to(dtype)
            .contiguous(channels_last);
  l.w = (at::randn({shape.k, shape.c, shape.r, shape.r}, cuda) *
         std::sqrt(2.0 / static_cast<double>(shape.c * shape.r * shape.r)))
            .to(dtype)
            .contiguous(channels_last);
  l.dy = at::randn({n, shape.k, shape.side, shape.side}, cuda).to(dtype).contiguous(channels_last);
  l.gamma = at::rand({shape.c}, cuda) + 0.5;
  l.beta = at::randn({shape.c}, cuda) * 0.1;
  l.running_mean = at::zeros({shape.c}, cuda);
  l.running_var = at::ones({shape.c}, cuda);
  const at::Tensor x = l.x.to(at::kFloat);
  l.sum = x.sum({0, 2, 3});
  l.sq_sum = (x * x).sum({0, 2, 3});
  return l;
}

// A layer's gradients: of x, of w, of the BN's gamma and beta.
struct Grads {
  at::Tensor dx, dw, dgamma, dbeta;
};

// A layer's BN (the layer's gamma and beta), input and weights as autograd leaves, and the
// gradients of a step through one of the two paths.
struct LayerLeaves {
  const Layer& l;
  torch::nn::BatchNorm2d bn;
  at::Tensor x, w;

  explicit LayerLeaves(const Layer& layer)
      : l(layer),
        bn(layer.shape.c),
        x(layer.x.detach().requires_grad_()),
        w(layer.w.detach().requires_grad_()) {
    bn->to(at::kCUDA);
    const torch::NoGradGuard no_grad;
    bn->weight.copy_(l.gamma);
    bn->bias.copy_(l.beta);
  }
  // The step's output y backward from the layer's dy, the gradients cleared first.
  void backward(const std::function<at::Tensor()>& forward) {
    for (at::Tensor t : {x, w, bn->weight, bn->bias}) t.mutable_grad().reset();
    forward().backward(l.dy);
  }
  Grads grads() const { return {x.grad(), w.grad(), bn->weight.grad(), bn->bias.grad()}; }
};

// Today's path: cuDNN's BN+ReLU (as the model runs it), then the convolution, through autograd.
struct TodayPath : LayerLeaves {
  using LayerLeaves::LayerLeaves;
  at::Tensor forward() {
    return at::conv2d(batch_norm_act(*bn, x, at::Tensor(), /*relu=*/true, /*fused=*/true), w, {}, 1,
                      l.pad());
  }
  void step() {
    backward([&] { return forward(); });
  }
};

// The same layer in float32 (TF32 off): what both paths' gradients are measured against.
Grads reference_grads(const Layer& l) {
  const at::Tensor x = l.x.to(at::kFloat).requires_grad_(), w = l.w.to(at::kFloat).requires_grad_();
  const at::Tensor gamma = l.gamma.clone().requires_grad_(), beta = l.beta.clone().requires_grad_();
  const at::Tensor activation =
      at::relu(at::batch_norm(x, gamma, beta, l.running_mean.clone(), l.running_var.clone(),
                              /*training=*/true, 0.1, 1e-5, /*cudnn_enabled=*/true));
  at::conv2d(activation, w, {}, 1, l.pad()).backward(l.dy.to(at::kFloat));
  return {x.grad(), w.grad(), gamma.grad(), beta.grad()};
}

// The fused layer as the model runs it (models/conv_bn_fusion.h, cuDNN's graphs): the BN's scale
// and bias from the sums of x, scale-bias-ReLU-conv with y's sums, through autograd.
struct FusedPath : LayerLeaves {
  using LayerLeaves::LayerLeaves;
  ConvOutput out;

  // "" when cuDNN builds the layer's graphs here, else which one it could not and why.
  std::string build() const {
    return conv_bn_graphs::prepare(l.x, l.w, 1, /*through_bn=*/true, /*with_stats=*/true);
  }
  std::string engines() const {
    return conv_bn_graphs::engines(l.x, l.w, 1, /*through_bn=*/true, /*with_stats=*/true);
  }
  void forward() {
    out = bn_relu_conv(*bn, {x, l.sum, l.sq_sum}, w, 1, true, ConvBnBackend::kCudnn);
  }
  void step() {
    backward([&] {
      forward();
      return out.y;
    });
  }
};

// 8 times the rounding error of the activations' dtype: 2^-11 in fp16, 2^-8 in bf16.
double io_bound(const at::Tensor& like) {
  return 8 * (like.scalar_type() == at::kHalf ? 0x1p-11 : 0x1p-8);
}

// The fused forward against the same arithmetic in float32 through ATen, each as a relative
// error, into `errors`; "" when each is within its bound: the BN's scale and bias from the batch's
// biased variance, as PyTorch's batch norm normalises.
std::string check_forward(const Layer& l, const FusedPath& f, std::string& errors) {
  const at::Tensor x = l.x.to(at::kFloat);
  const at::Tensor mean = x.mean({0, 2, 3}), var = x.var({0, 2, 3}, /*unbiased=*/false);
  const at::Tensor scale = l.gamma / at::sqrt(var + 1e-5), bias = l.beta - mean * scale;
  // The activation as the convolution's tensor cores read it: scale and bias in the activations'
  // dtype, the activation rounded to it.
  auto io = [&](const at::Tensor& t) {
    return t.to(l.x.scalar_type()).to(at::kFloat).view({1, -1, 1, 1});
  };
  const at::Tensor input = at::relu(x * io(scale) + io(bias)).to(l.x.scalar_type()).to(at::kFloat);
  const at::Tensor y = f.out.y.to(at::kFloat);
  const std::array<double, 3> error = {
      relative_error(f.out.y, at::conv2d(input, l.w.to(at::kFloat), {}, 1, l.pad())),
      relative_error(f.out.sum, y.sum({0, 2, 3})),
      relative_error(f.out.sq_sum, (y * y).sum({0, 2, 3}))};
  char line[128];
  std::snprintf(line, sizeof line, "forward errors: y %.1e, y sums %.1e %.1e", error[0], error[1],
                error[2]);
  errors = line;
  for (const double e : error)
    if (!(e <= io_bound(l.x))) return "the fused forward is off ATen's by more than the bounds";
  return "";
}

// The fused gradients against float32 autograd, each no further off than today's path in the
// same dtype is (twice as far, or 8 rounding errors, whichever is more), into `errors`.
std::string check_backward(const Layer& l, const Grads& fused_grads, const Grads& today,
                           std::string& errors) {
  const Grads want = reference_grads(l);
  const std::array<std::pair<at::Tensor, at::Tensor>, 4> pairs = {
      {{fused_grads.dx, today.dx},
       {fused_grads.dw, today.dw},
       {fused_grads.dgamma, today.dgamma},
       {fused_grads.dbeta, today.dbeta}}};
  const std::array<at::Tensor, 4> wanted = {want.dx, want.dw, want.dgamma, want.dbeta};
  const char* names[] = {"dx", "dw", "dgamma", "dbeta"};
  std::string failure;
  errors += "; gradient errors, fused/today:";
  for (size_t i = 0; i < pairs.size(); ++i) {
    const double fused = relative_error(pairs[i].first, wanted[i]);
    const double now = relative_error(pairs[i].second, wanted[i]);
    char part[64];
    std::snprintf(part, sizeof part, " %s %.1e/%.1e", names[i], fused, now);
    errors += part;
    if (!(fused <= std::max(2 * now, io_bound(l.x)))) failure = "fused gradients off";
  }
  return failure.empty() ? "" : failure + " by more than today's path";
}

// One shape's line; adds its times, weighted by its count, to the totals when the fusion was
// built and computes what today's path does.
bool measure(const ConvShape& shape, const Options& o, at::ScalarType dtype,
             std::array<double, 2>& totals) {
  const Layer l = make_layer(shape, o.batch, dtype);
  TodayPath today(l);
  const double today_forward = time_ms(o.iterations, [&] { today.forward(); });
  const double today_step = time_ms(o.iterations, [&] { today.step(); });
  std::printf("%-11s c%-4lld k%-5lld %2lldx%-2lld today: forward %.3f ms, backward %.3f ms",
              shape.name, static_cast<long long>(shape.c), static_cast<long long>(shape.k),
              static_cast<long long>(shape.side), static_cast<long long>(shape.side), today_forward,
              today_step - today_forward);
  FusedPath fused(l);
  const auto build_start = std::chrono::steady_clock::now();  // runtime-compiled engines: seconds
  std::string failure = fused.build();
  const double build_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - build_start).count();
  if (!failure.empty()) {
    std::printf("\n  not built: %s\n", failure.c_str());
    return false;
  }
  fused.step();
  std::string errors;
  failure = check_forward(l, fused, errors);
  if (std::string off = check_backward(l, fused.grads(), today.grads(), errors); failure.empty())
    failure = off;
  const double forward_ms = time_ms(o.iterations, [&] { fused.forward(); });
  const double step_ms = time_ms(o.iterations, [&] { fused.step(); });
  std::printf("; fused: forward %.3f ms, backward %.3f ms (%.2fx), built in %.1f s\n  %s\n  %s\n",
              forward_ms, step_ms - forward_ms, today_step / step_ms, build_s, errors.c_str(),
              fused.engines().c_str());
  if (!failure.empty()) {
    std::printf("  %s\n", failure.c_str());
    return false;
  }
  totals[0] += today_step * static_cast<double>(shape.count);
  totals[1] += step_ms * static_cast<double>(shape.count);
  return true;
}

int run_benchmark(const Options& o) {
  USER_CHECK(at::cuda::is_available(),
             "no GPU is visible here: run it on a GPU machine (scripts/device/checks.sh fusion)");
  const at::ScalarType dtype = o.precision == "bf16" ? at::kBFloat16 : at::kHalf;
  at::globalContext().setAllowTF32CuDNN(false);  // the float32 references in float32, not TF32
  at::globalContext().setBenchmarkCuDNN(o.cudnn_benchmark);
  std::printf(
      "bench-conv-fusion: %s, batch %lld, 224 px, channels_last, cudnn_benchmark %s; %s, cuDNN "
      "%zu\n",
      o.precision.c_str(), static_cast<long long>(o.batch), o.cudnn_benchmark ? "on" : "off",
      at::cuda::getCurrentDeviceProperties()->name, cudnnGetVersion());
  std::array<double, 2> totals = {0, 0};  // today, fused
  bool all = true;
  for (const ConvShape& shape : kShapes) all = measure(shape, o, dtype, totals) && all;
  if (all)
    std::printf(
        "ResNet-50's 32 convolutions that read a BN+ReLU, with their BNs, forward + backward: "
        "today %.1f ms, fused %.1f ms (%.2fx)\n",
        totals[0], totals[1], totals[0] / totals[1]);
  return all ? 0 : 1;
}

}  // namespace
}  // namespace trainer

int main(int argc, char** argv) {
  trainer::Options o;
  CLI::App app{"cuDNN's convolution + batch norm fusions against the trainer's path (GPU)",
               "bench-conv-fusion"};
  app.add_option("--batch", o.batch, "images per step")->check(CLI::PositiveNumber);
  app.add_option("--precision", o.precision, "fp16 or bf16")
      ->check(CLI::IsMember({"fp16", "bf16"}));
  app.add_option("--iterations", o.iterations, "timed runs of each")->check(CLI::PositiveNumber);
  app.add_option("--cudnn-benchmark", o.cudnn_benchmark,
                 "autotune both paths (every fused plan built and timed), as the trainer does");
  return trainer::run_tool(app, argc, argv, [&] { return trainer::run_benchmark(o); });
}
