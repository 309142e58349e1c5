// bench-conv-fusion: whether cuDNN fuses ResNet-50's convolutions with the batch norm around them
// on this GPU, and what that would save, before the fusion is built into the model.
//   bench-conv-fusion --batch 256 --precision fp16
// For each bottleneck convolution that reads a BN+ReLU (each block's 3x3 and its last 1x1), at
// 224 px, it times the trainer's path today (cuDNN's BN+ReLU kernel, then the convolution;
// autograd's backward through both) against the convolution-side fusion of NVIDIA's MLPerf
// ResNet-50, built from cudnn-frontend graphs:
// - forward: BN-finalize (the batch's statistics, from the previous convolution's sums, into the
//   BN's scale and bias and its running statistics), then scale-bias-ReLU-conv-genstats (the BN
//   and ReLU applied as the convolution reads its input; the sums of its output, which the next
//   BN needs, written by its epilogue): the activation is no longer written and read again.
// - backward: dgrad-dReLU-dBN-weight (the convolution's input gradient through the ReLU, with the
//   BN's weight gradients and the coefficients of its input gradient), scale-bias-ReLU-wgrad (the
//   weight gradient from the recomputed activation), and the BN's input gradient from those
//   coefficients (here ATen's element-wise ops: an upper bound on one fused pass).
// It checks the fused forward against ATen in float32, and says which graphs cuDNN cannot build
// here, with cuDNN's reason.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "base/check.h"
#include "models/cuda/fused_batch_norm.h"
#include "src/tools/cudnn_graph.h"
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
};

// Mean milliseconds of `work` on the current stream, after warm-up runs (cuDNN's autotuning).
double time_ms(int64_t iterations, const std::function<void()>& work) {
  for (int i = 0; i < 3; ++i) work();
  at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
  start.record();
  for (int64_t i = 0; i < iterations; ++i) work();
  stop.record();
  stop.synchronize();
  return start.elapsed_time(stop) / static_cast<double>(iterations);
}

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

// Today's path: cuDNN's BN+ReLU (as the model runs it), then the convolution. Forward, and
// forward + backward through autograd, in ms.
std::pair<double, double> time_today(const Layer& l, int64_t iterations) {
  torch::nn::BatchNorm2d bn(l.shape.c);
  bn->to(at::kCUDA);
  {
    const torch::NoGradGuard no_grad;
    bn->weight.copy_(l.gamma);
    bn->bias.copy_(l.beta);
  }
  at::Tensor x = l.x.detach().requires_grad_(), w = l.w.detach().requires_grad_();
  auto forward = [&] {
    return at::conv2d(batch_norm_act(*bn, x, at::Tensor(), /*relu=*/true, /*fused=*/true), w, {}, 1,
                      l.pad());
  };
  const double forward_ms = time_ms(iterations, [&] { forward(); });
  const double step_ms = time_ms(iterations, [&] {
    forward().backward(l.dy);
    for (at::Tensor t : {x, w, bn->weight, bn->bias}) t.mutable_grad().reset();
  });
  return {forward_ms, step_ms};
}

template <typename Attributes>
Attributes same_padding(Attributes attributes, int64_t pad) {
  return attributes.set_padding({pad, pad}).set_stride({1, 1}).set_dilation({1, 1});
}

at::Tensor like_channels_last(const at::Tensor& like, at::IntArrayRef sizes) {
  return at::empty(sizes, like.options().memory_format(c10::MemoryFormat::ChannelsLast));
}

// The forward fused: BN-finalize (the BN's scale and bias, and its running statistics, from the
// sums of its input), then scale-bias-ReLU-conv-genstats (the convolution reading the BN+ReLU of
// its input, and writing the sums of its output for the next BN).
struct FusedForward {
  CudnnGraph finalize{at::kFloat, at::kFloat}, conv;
  at::Tensor scale, bias, mean, inv_var, mean_out, var_out;  // float32 (C)
  at::Tensor io_scale, io_bias;  // scale and bias in the activations' dtype, as conv reads them
  at::Tensor y, y_sum, y_sq_sum;

  explicit FusedForward(const Layer& l) : conv(l.x.scalar_type(), at::kFloat) {
    const ConvShape& s = l.shape;
    for (at::Tensor* t : {&scale, &bias, &mean, &inv_var, &mean_out, &var_out})
      *t = at::empty({s.c}, l.gamma.options());
    io_scale = at::empty({s.c}, l.x.options());
    io_bias = at::empty_like(io_scale);
    y = like_channels_last(l.x, {l.n, s.k, s.side, s.side});
    y_sum = at::empty({s.k}, l.gamma.options());
    y_sq_sum = at::empty_like(y_sum);

    fe::graph::Graph& g = finalize.graph();
    GraphTensor running_mean = finalize.input("running_mean", l.running_mean);
    GraphTensor running_var = finalize.input("running_var", l.running_var);
    GraphTensor momentum = g.tensor(0.1f);  // torchvision's
    const auto outputs =
        g.bn_finalize(finalize.input("sum", l.sum), finalize.input("sq_sum", l.sq_sum),
                      finalize.input("gamma", l.gamma), finalize.input("beta", l.beta),
                      g.tensor(1e-5f), g.tensor(l.n * s.side * s.side),
                      fe::graph::BN_finalize_attributes().set_previous_running_stats(
                          running_mean, running_var, momentum));
    const std::array<at::Tensor, 6> targets = {scale, bias, mean, inv_var, mean_out, var_out};
    for (size_t i = 0; i < targets.size(); ++i) finalize.output(outputs[i], targets[i]);

    GraphTensor activation = conv.scale_bias_relu(
        conv.input("x", l.x), conv.input("scale", io_scale), conv.input("bias", io_bias));
    GraphTensor out =
        conv.graph().conv_fprop(activation, conv.input("w", l.w),
                                same_padding(fe::graph::Conv_fprop_attributes(), l.pad()));
    conv.output(out, y);
    const auto [sum, sq_sum] = conv.graph().genstats(out, fe::graph::Genstats_attributes());
    conv.output(sum, y_sum);
    conv.output(sq_sum, y_sq_sum);
  }
  std::string build() {
    if (std::string failure = finalize.build(); !failure.empty()) return "BN-finalize: " + failure;
    if (std::string failure = conv.build(); !failure.empty())
      return "scale-bias-ReLU-conv-genstats: " + failure;
    return "";
  }
  void run() {
    finalize.execute();
    io_scale.copy_(scale);
    io_bias.copy_(bias);
    conv.execute();
  }
};

// The fused forward's results against the same arithmetic in float32 through ATen, each as a
// relative error; "" when each is within what rounding to the activations' dtype allows.
std::string check_forward(const Layer& l, const FusedForward& f, std::string& errors) {
  const double count = static_cast<double>(l.n * l.shape.side * l.shape.side);
  const at::Tensor mean = l.sum / count, var = l.sq_sum / count - mean * mean;
  const at::Tensor want_scale = l.gamma / at::sqrt(var + 1e-5);
  const at::Tensor want_bias = l.beta - mean * want_scale;
  // PyTorch's running statistics: momentum 0.1, the variance unbiased.
  const at::Tensor want_running_mean = 0.9 * l.running_mean + 0.1 * mean;
  const at::Tensor want_running_var = 0.9 * l.running_var + 0.1 * var * (count / (count - 1));
  // The activation as the convolution's tensor cores read it: rounded to the activations' dtype.
  const at::Tensor input =
      at::relu(l.x.to(at::kFloat) * f.io_scale.to(at::kFloat).view({1, -1, 1, 1}) +
               f.io_bias.to(at::kFloat).view({1, -1, 1, 1}))
          .to(l.x.scalar_type())
          .to(at::kFloat);
  const at::Tensor want_y = at::conv2d(input, l.w.to(at::kFloat), {}, 1, l.pad());
  const at::Tensor y = f.y.to(at::kFloat);
  const std::array<double, 7> error = {relative_error(f.scale, want_scale),
                                       relative_error(f.bias, want_bias),
                                       relative_error(f.mean_out, want_running_mean),
                                       relative_error(f.var_out, want_running_var),
                                       relative_error(f.y, want_y),
                                       relative_error(f.y_sum, y.sum({0, 2, 3})),
                                       relative_error(f.y_sq_sum, (y * y).sum({0, 2, 3}))};
  char line[200];
  std::snprintf(line, sizeof line,
                "errors: scale %.1e, bias %.1e, running stats %.1e %.1e, y %.1e, y sums %.1e %.1e",
                error[0], error[1], error[2], error[3], error[4], error[5], error[6]);
  errors = line;
  // The finalize in float32; the rest 8 times the activations' dtype's rounding error (2^-11 in
  // fp16, 2^-8 in bf16), of which y has one rounding and its sums none or one per term.
  const double io_bound = 8 * (l.x.scalar_type() == at::kHalf ? 0x1p-11 : 0x1p-8);
  const std::array<double, 7> bound = {1e-4, 1e-4, 1e-4, 1e-4, io_bound, io_bound, io_bound};
  for (size_t i = 0; i < error.size(); ++i)
    if (!(error[i] <= bound[i])) return "fused forward off ATen's by more than the bounds";
  return "";
}

// The backward fused: dgrad-dReLU-dBN-weight (the convolution's input gradient through the ReLU,
// with the BN's weight gradients and the coefficients of its input gradient) and
// scale-bias-ReLU-wgrad (the weight gradient from the activation recomputed), then the BN's
// input gradient from the coefficients (ATen's element-wise ops: an upper bound on one pass).
struct FusedBackward {
  CudnnGraph dgrad, wgrad;
  at::Tensor mean, inv_var, io_scale, io_bias;  // the BN's statistics and its scale and bias
  at::Tensor drelu, dw, dx;
  std::array<at::Tensor, 5> coefficients;  // float32 (C): dgamma, dbeta, dy's, x's, and a bias

  explicit FusedBackward(const Layer& l)
      : dgrad(l.x.scalar_type(), at::kFloat), wgrad(l.x.scalar_type(), l.x.scalar_type()) {
    const ConvShape& s = l.shape;
    mean = l.sum / static_cast<double>(l.n * s.side * s.side);
    inv_var = at::ones_like(l.gamma);
    io_scale = l.gamma.to(l.x.scalar_type());
    io_bias = l.beta.to(l.x.scalar_type());
    drelu = at::empty_like(l.x);
    dx = at::empty_like(l.x);
    dw = at::empty_like(l.w);
    for (at::Tensor& t : coefficients) t = at::empty({s.c}, l.gamma.options());

    using Mode = fe::PointwiseMode_t;
    GraphTensor dgrad_out =
        dgrad.graph().conv_dgrad(dgrad.input("dy", l.dy), dgrad.input("w", l.w),
                                 same_padding(fe::graph::Conv_dgrad_attributes(), l.pad()));
    dgrad_out->set_dim({l.n, s.c, s.side, s.side});
    GraphTensor x = dgrad.input("x", l.x), m = dgrad.input("mean", mean);
    GraphTensor v = dgrad.input("inv_var", inv_var), gamma = dgrad.input("gamma", l.gamma);
    GraphTensor bn = dgrad.pointwise(
        Mode::ADD,
        dgrad.pointwise(Mode::MUL, dgrad.pointwise(Mode::MUL, dgrad.pointwise(Mode::SUB, x, m), v),
                        gamma),
        dgrad.input("beta", l.beta));
    GraphTensor relu_grad = dgrad.pointwise(Mode::RELU_BWD, dgrad_out, bn);
    dgrad.output(relu_grad, drelu);
    const auto outputs =
        dgrad.graph().dbn_weight(relu_grad, x, m, v, gamma, fe::graph::DBN_weight_attributes());
    for (size_t i = 0; i < coefficients.size(); ++i) dgrad.output(outputs[i], coefficients[i]);

    GraphTensor activation = wgrad.scale_bias_relu(
        wgrad.input("x", l.x), wgrad.input("scale", io_scale), wgrad.input("bias", io_bias));
    GraphTensor weight_grad =
        wgrad.graph().conv_wgrad(wgrad.input("dy", l.dy), activation,
                                 same_padding(fe::graph::Conv_wgrad_attributes(), l.pad()));
    wgrad.output(weight_grad, dw);
  }
  std::string build() {
    if (std::string failure = dgrad.build(); !failure.empty())
      return "dgrad-dReLU-dBN-weight: " + failure;
    if (std::string failure = wgrad.build(); !failure.empty())
      return "scale-bias-ReLU-wgrad: " + failure;
    return "";
  }
  void run(const Layer& l) {
    dgrad.execute();
    wgrad.execute();
    auto per_channel = [](const at::Tensor& t) { return t.view({1, -1, 1, 1}); };
    dx.copy_(drelu * per_channel(coefficients[2]) + l.x * per_channel(coefficients[3]) +
             per_channel(coefficients[4]));
  }
};

// One shape's line; adds its times, weighted by its count, to the totals. False when a fused
// graph could not be built or its forward was off.
bool measure(const ConvShape& shape, const Options& o, at::ScalarType dtype,
             std::array<double, 2>& totals) {
  const Layer l = make_layer(shape, o.batch, dtype);
  const auto [today_forward, today_step] = time_today(l, o.iterations);
  std::printf("%-11s c%-4lld k%-5lld %2lldx%-2lld today: forward %.3f ms, backward %.3f ms",
              shape.name, static_cast<long long>(shape.c), static_cast<long long>(shape.k),
              static_cast<long long>(shape.side), static_cast<long long>(shape.side), today_forward,
              today_step - today_forward);
  FusedForward forward(l);
  FusedBackward backward(l);
  const auto build_start = std::chrono::steady_clock::now();  // runtime-compiled engines: seconds
  std::string failure = forward.build();
  if (failure.empty()) failure = backward.build();
  const double build_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - build_start).count();
  if (!failure.empty()) {
    std::printf("\n  not built: %s\n", failure.c_str());
    return false;
  }
  forward.run();
  std::string errors;
  failure = check_forward(l, forward, errors);
  const double forward_ms = time_ms(o.iterations, [&] { forward.run(); });
  const double backward_ms = time_ms(o.iterations, [&] { backward.run(l); });
  std::printf("; fused: forward %.3f ms, backward %.3f ms (%.2fx), built in %.1f s; %s\n",
              forward_ms, backward_ms, today_step / (forward_ms + backward_ms), build_s,
              errors.c_str());
  if (!failure.empty()) std::printf("  %s\n", failure.c_str());
  totals[0] += today_step * static_cast<double>(shape.count);
  totals[1] += (forward_ms + backward_ms) * static_cast<double>(shape.count);
  return failure.empty();
}

int run_benchmark(const Options& o) {
  USER_CHECK(at::cuda::is_available(),
             "no GPU is visible here: run it on a GPU machine (scripts/device-checks.sh fusion)");
  const at::ScalarType dtype = o.precision == "bf16" ? at::kBFloat16 : at::kHalf;
  at::globalContext().setAllowTF32CuDNN(false);  // the float32 references in float32, not TF32
  std::printf("bench-conv-fusion: %s, batch %lld, 224 px, channels_last; %s, cuDNN %zu\n",
              o.precision.c_str(), static_cast<long long>(o.batch),
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
  return trainer::run_tool(app, argc, argv, [&] { return trainer::run_benchmark(o); });
}
