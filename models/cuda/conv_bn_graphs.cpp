#include "models/cuda/conv_bn_graphs.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>

#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "base/user_error.h"
#include "models/cuda/cudnn_graph.h"
#include "models/same_conv.h"

// Note [Convolution-side batch norm graphs]
// Each graph is declared over a list of tensors, each of its tensors one place in the list, and
// run later on another list of the same shapes (CudnnGraph::execute). The same *_tensors function
// makes both lists: prepare() makes it of meta tensors to build, the ops of real ones to run, so
// the two cannot drift apart. A graph is keyed by its kind, the GPU, the stride and every
// tensor's sizes and dtype (4-D ones are NHWC); a shape cuDNN has no engine for is remembered as
// its reason.

namespace trainer::conv_bn_graphs {
namespace {

using Mode = fe::PointwiseMode_t;
using Tensors = std::vector<at::Tensor>;

template <typename Attributes>
Attributes geometry(Attributes attributes, int64_t stride, const at::Tensor& w) {
  const int64_t pad = same_padding(w);
  return attributes.set_padding({pad, pad}).set_stride({stride, stride}).set_dilation({1, 1});
}

// What each kind of graph takes and gives, in order: its tensors' places in a Tensors list.
enum Forward { kX, kW, kScale, kBias, kY, kSum, kSqSum, kForwardTensors };
enum Dgrad { kDy, kDgradW, kDgradX, kMean, kInvstd, kGamma, kBeta, kDrelu };
enum Wgrad { kWgradDy, kWgradX, kWgradScale, kWgradBias, kDw, kWgradTensors };
enum DgradAdd { kAddDy, kAddW, kAddOther, kAddDx, kDgradAddTensors };
constexpr size_t kDgradOutputs = 6;  // drelu, then dbn_weight's five (dgamma, dbeta, 3 unused)

// t: x, w, scale, bias (undefined without a BN), y, sum, sq_sum (undefined without statistics).
void declare_forward(CudnnGraph& g, const Tensors& t, int64_t stride) {
  GraphTensor x = g.input("x", kX);
  if (t[kScale].defined())  // the BN's scale, bias and ReLU as the convolution's prologue
    x = g.scale_bias_relu(x, g.input("scale", kScale), g.input("bias", kBias));
  GraphTensor y = g.graph().conv_fprop(x, g.input("w", kW),
                                       geometry(fe::graph::Conv_fprop_attributes(), stride, t[kW]));
  g.output(y, kY);
  if (!t[kSum].defined()) return;
  const auto [sum, sq_sum] = g.graph().genstats(y, fe::graph::Genstats_attributes());
  g.output(sum, kSum);
  g.output(sq_sum, kSqSum);
}

// t: dy, w, x, mean, invstd, gamma, beta, then drelu and dbn_weight's five outputs. The pattern
// of cudnn-frontend's DgradDreluBNBwdWeight sample, which cuDNN's fused engine matches: the BN's
// output recomputed in float32 from its batch statistics, gamma and beta.
void declare_dgrad(CudnnGraph& g, const Tensors& t, int64_t stride) {
  GraphTensor d_activation =
      g.graph().conv_dgrad(g.input("dy", kDy), g.input("w", kDgradW),
                           geometry(fe::graph::Conv_dgrad_attributes(), stride, t[kDgradW]));
  d_activation->set_dim(t[kDgradX].sizes().vec());
  GraphTensor x = g.input("x", kDgradX), mean = g.input("mean", kMean);
  GraphTensor invstd = g.input("invstd", kInvstd), gamma = g.input("gamma", kGamma);
  GraphTensor normalized = g.pointwise(
      Mode::MUL, g.pointwise(Mode::MUL, g.pointwise(Mode::SUB, x, mean), invstd), gamma);
  GraphTensor pre_relu = g.pointwise(Mode::ADD, normalized, g.input("beta", kBeta));
  GraphTensor drelu = g.pointwise(Mode::RELU_BWD, d_activation, pre_relu);
  g.output(drelu, kDrelu);
  const auto outputs =
      g.graph().dbn_weight(drelu, x, mean, invstd, gamma, fe::graph::DBN_weight_attributes());
  for (size_t i = 0; i < outputs.size(); ++i) g.output(outputs[i], kDrelu + 1 + i);
}

// t: dy, x, scale, bias, dw.
void declare_wgrad(CudnnGraph& g, const Tensors& t, int64_t stride) {
  GraphTensor x = g.scale_bias_relu(g.input("x", kWgradX), g.input("scale", kWgradScale),
                                    g.input("bias", kWgradBias));
  GraphTensor dw = g.graph().conv_wgrad(
      g.input("dy", kWgradDy), x, geometry(fe::graph::Conv_wgrad_attributes(), stride, t[kDw]));
  g.output(dw, kDw);
}

// t: dy, w, other, dx: dx = dgrad(dy, w) + other, the sum in float32 before dx's dtype.
void declare_dgrad_add(CudnnGraph& g, const Tensors& t, int64_t stride) {
  GraphTensor dgrad =
      g.graph().conv_dgrad(g.input("dy", kAddDy), g.input("w", kAddW),
                           geometry(fe::graph::Conv_dgrad_attributes(), stride, t[kAddW]));
  dgrad->set_dim(t[kAddDx].sizes().vec());
  g.output(g.pointwise(Mode::ADD, dgrad, g.input("other", kAddOther)), kAddDx);
}

using Declare = void (*)(CudnnGraph&, const Tensors&, int64_t);

// What a graph is built for (Note [Convolution-side batch norm graphs]). The cache holds one
// graph per key a run meets and none is evicted: a few per layer (the step's batch, an epoch's
// short last step, each size of progressive resizing), bounded by the run's shapes.
struct GraphKey {
  std::string_view kind;  // the declare function's name for it
  int device = 0;
  int64_t stride = 1;
  std::vector<std::pair<std::vector<int64_t>, at::ScalarType>> tensors;  // undefined: {}, Undefined

  GraphKey(const char* kind, const Tensors& t, int64_t stride)
      : kind(kind), device(c10::cuda::current_device()), stride(stride) {
    for (const at::Tensor& x : t)
      tensors.emplace_back(x.defined() ? x.sizes().vec() : std::vector<int64_t>{},
                           x.defined() ? x.scalar_type() : at::ScalarType::Undefined);
  }
  bool operator<(const GraphKey& other) const {
    return std::tie(kind, device, stride, tensors) <
           std::tie(other.kind, other.device, other.stride, other.tensors);
  }
  // "conv_bn_forward gpu0 stride1 [256, 64, 56, 56]Half ... -" for an error.
  std::string describe() const {
    std::ostringstream out;
    out << kind << " gpu" << device << " stride" << stride;
    for (const auto& [sizes, dtype] : tensors) {
      if (dtype == at::ScalarType::Undefined) {
        out << " -";
        continue;
      }
      out << " " << c10::IntArrayRef(sizes) << c10::toString(dtype);
    }
    return out.str();
  }
};

struct Built {
  std::unique_ptr<CudnnGraph> graph;  // null when cuDNN could not build it
  std::string failure;
};

// The graph of this kind for these tensors' shapes, built on first use; its failure kept.
Built& built(const char* kind, Declare declare, const Tensors& t, int64_t stride,
             at::ScalarType intermediate) {
  static std::mutex mutex;
  static std::map<GraphKey, Built> graphs;
  const std::lock_guard<std::mutex> lock(mutex);
  GraphKey key(kind, t, stride);
  if (auto it = graphs.find(key); it != graphs.end()) return it->second;
  Built b;
  b.graph = std::make_unique<CudnnGraph>(t.front().scalar_type(), intermediate, t);
  try {
    declare(*b.graph, t, stride);
    b.failure = b.graph->build();
  } catch (const std::exception& e) {  // a dtype or shape the graph API refuses outright
    b.failure = e.what();
  }
  if (!b.failure.empty()) b.graph.reset();
  return graphs.emplace(std::move(key), std::move(b)).first->second;
}

// Runs the graph of this kind on t (declared from t's shapes on first use).
void run(const char* kind, Declare declare, const Tensors& t, int64_t stride,
         at::ScalarType intermediate) {
  Built& b = built(kind, declare, t, stride, intermediate);
  USER_CHECK(b.graph, "cuDNN has no ", kind, " graph for ", GraphKey(kind, t, stride).describe(),
             ": ", b.failure,
             ". Fix: fused_conv_batch_norm = false, fused_residual_gradient = false");
  b.graph->execute(t);
}

at::Tensor activation_like(const at::Tensor& like, at::IntArrayRef sizes) {
  return at::empty(sizes, like.options().memory_format(at::MemoryFormat::ChannelsLast));
}

at::Tensor per_channel(const at::Tensor& like, int64_t channels, at::ScalarType dtype) {
  return at::empty({channels},
                   like.options().dtype(dtype).memory_format(at::MemoryFormat::Contiguous));
}

std::vector<int64_t> output_sizes(const at::Tensor& x, const at::Tensor& w, int64_t stride) {
  const int64_t pad = w.size(2) / 2;
  auto side = [&](int64_t in) { return (in + 2 * pad - w.size(2)) / stride + 1; };
  return {x.size(0), w.size(0), side(x.size(2)), side(x.size(3))};
}

// The forward graph's tensors for x and w, with y and its statistics made here.
Tensors forward_tensors(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& bias,
                        const at::Tensor& w, int64_t stride, bool with_stats) {
  Tensors t(kForwardTensors);
  t[kX] = x, t[kW] = w, t[kScale] = scale, t[kBias] = bias;
  t[kY] = activation_like(x, output_sizes(x, w, stride));
  if (with_stats) {
    t[kSum] = per_channel(x, w.size(0), at::kFloat);
    t[kSqSum] = per_channel(x, w.size(0), at::kFloat);
  }
  return t;
}

Tensors dgrad_tensors(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                      const at::Tensor& mean, const at::Tensor& invstd, const at::Tensor& gamma,
                      const at::Tensor& beta) {
  Tensors t = {dy, w, x, mean, invstd, gamma, beta, at::empty_like(x)};
  for (size_t i = 0; i < kDgradOutputs - 1; ++i) t.push_back(per_channel(x, x.size(1), at::kFloat));
  return t;
}

Tensors dgrad_add_tensors(const at::Tensor& dy, const at::Tensor& w, const at::Tensor& other) {
  Tensors t(kDgradAddTensors);
  t[kAddDy] = dy, t[kAddW] = w, t[kAddOther] = other;
  t[kAddDx] = activation_like(other, other.sizes());
  return t;
}

Tensors wgrad_tensors(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& scale,
                      const at::Tensor& bias, const at::Tensor& w) {
  Tensors t(kWgradTensors);
  t[kWgradDy] = dy, t[kWgradX] = x, t[kWgradScale] = scale, t[kWgradBias] = bias;
  t[kDw] = activation_like(w, w.sizes());
  return t;
}

// One graph a convolution needs, declared over meta tensors of its shapes.
struct GraphSpec {
  const char* kind;
  Declare declare;
  Tensors tensors;
  at::ScalarType intermediate;
  std::string what;  // for messages
};

// The graphs of a convolution of x by w at `stride`: its forward, and when it reads x through a
// BN (its backward is otherwise ATen's) dgrad-dReLU-dBN-weight and scale-bias-ReLU-wgrad.
std::vector<GraphSpec> graph_specs(const at::Tensor& x_like, const at::Tensor& w_like,
                                   int64_t stride, bool through_bn, bool with_stats) {
  const auto meta =
      x_like.options().device(at::kMeta).memory_format(at::MemoryFormat::ChannelsLast);
  const at::Tensor x = at::empty(x_like.sizes(), meta), w = at::empty(w_like.sizes(), meta);
  const at::ScalarType io = x.scalar_type();
  const at::Tensor scale = through_bn ? per_channel(x, x.size(1), io) : at::Tensor();
  const at::Tensor bias = through_bn ? per_channel(x, x.size(1), io) : at::Tensor();
  const Tensors forward = forward_tensors(x, scale, bias, w, stride, with_stats);
  std::vector<GraphSpec> specs = {
      {"forward", declare_forward, forward, at::kFloat,
       through_bn ? "scale-bias-ReLU-conv" + std::string(with_stats ? "-genstats" : "")
                  : "conv-genstats"}};
  if (!through_bn) return specs;
  const at::Tensor dy = forward[kY], stats = per_channel(x, x.size(1), at::kFloat);
  specs.push_back({"dgrad", declare_dgrad, dgrad_tensors(dy, x, w, stats, stats, stats, stats),
                   at::kFloat, "dgrad-dReLU-dBN-weight"});
  specs.push_back(
      {"wgrad", declare_wgrad, wgrad_tensors(dy, x, scale, bias, w), io, "scale-bias-ReLU-wgrad"});
  return specs;
}

}  // namespace

std::string prepare(const at::Tensor& x_like, const at::Tensor& w_like, int64_t stride,
                    bool through_bn, bool with_stats) {
  for (const GraphSpec& g : graph_specs(x_like, w_like, stride, through_bn, with_stats)) {
    const Built& b = built(g.kind, g.declare, g.tensors, stride, g.intermediate);
    if (!b.graph) return g.what + ": " + b.failure;
  }
  return "";
}

std::string engines(const at::Tensor& x_like, const at::Tensor& w_like, int64_t stride,
                    bool through_bn, bool with_stats) {
  std::string out;
  for (const GraphSpec& g : graph_specs(x_like, w_like, stride, through_bn, with_stats)) {
    const Built& b = built(g.kind, g.declare, g.tensors, stride, g.intermediate);
    out += (out.empty() ? "" : "; ") + g.what + ": " + (b.graph ? b.graph->plan_name() : b.failure);
  }
  return out;
}

std::string validate(const at::Tensor& x_like, const at::Tensor& w_like, int64_t stride,
                     bool through_bn, bool with_stats) {
  for (const GraphSpec& g : graph_specs(x_like, w_like, stride, through_bn, with_stats)) {
    CudnnGraph graph(g.tensors.front().scalar_type(), g.intermediate, g.tensors);
    g.declare(graph, g.tensors, stride);
    if (std::string failure = graph.validate(); !failure.empty()) return g.what + ": " + failure;
  }
  return "";
}

ConvWithStats conv_stats(const at::Tensor& x, const at::Tensor& w, int64_t stride) {
  const Tensors t = forward_tensors(x, {}, {}, w, stride, /*with_stats=*/true);
  run("forward", declare_forward, t, stride, at::kFloat);
  return {t[kY], t[kSum], t[kSqSum]};
}

ConvWithStats scale_bias_relu_conv(const at::Tensor& x, const at::Tensor& scale,
                                   const at::Tensor& bias, const at::Tensor& w, int64_t stride,
                                   bool with_stats) {
  const Tensors t = forward_tensors(x, scale, bias, w, stride, with_stats);
  run("forward", declare_forward, t, stride, at::kFloat);
  return {t[kY], t[kSum], t[kSqSum]};
}

BnReluConvGrads bn_relu_conv_backward(const at::Tensor& dy, const at::Tensor& x,
                                      const at::Tensor& w, const at::Tensor& scale,
                                      const at::Tensor& bias, const BnStatistics& bn,
                                      int64_t stride) {
  const Tensors dgrad = dgrad_tensors(dy, x, w, bn.mean, bn.invstd, bn.gamma, bn.beta);
  run("dgrad", declare_dgrad, dgrad, stride, at::kFloat);
  const Tensors wgrad = wgrad_tensors(dy, x, scale, bias, w);
  run("wgrad", declare_wgrad, wgrad, stride, x.scalar_type());
  return {dgrad[kDrelu], dgrad[kDrelu + 1], dgrad[kDrelu + 2], wgrad[kDw]};
}

namespace {

// The dgrad-add graph's tensors, as meta tensors of these shapes and dtypes.
Tensors dgrad_add_meta(const at::Tensor& dy_like, const at::Tensor& w_like,
                       const at::Tensor& other_like) {
  auto meta = [](const at::Tensor& like) {
    return at::empty(like.sizes(), like.options().device(at::kMeta).memory_format(
                                       at::MemoryFormat::ChannelsLast));
  };
  return dgrad_add_tensors(meta(dy_like), meta(w_like), meta(other_like));
}

// The dgrad-add graph for tensors of these shapes, built on first use.
const Built& dgrad_add_graph(const at::Tensor& dy_like, const at::Tensor& w_like,
                             const at::Tensor& other_like, int64_t stride) {
  return built("dgrad_add", declare_dgrad_add, dgrad_add_meta(dy_like, w_like, other_like), stride,
               at::kFloat);
}

}  // namespace

std::string validate_dgrad_add(const at::Tensor& dy_like, const at::Tensor& w_like,
                               const at::Tensor& other_like, int64_t stride) {
  const Tensors t = dgrad_add_meta(dy_like, w_like, other_like);
  CudnnGraph graph(t.front().scalar_type(), at::kFloat, t);
  declare_dgrad_add(graph, t, stride);
  const std::string failure = graph.validate();
  return failure.empty() ? "" : "dgrad-add: " + failure;
}

std::string prepare_dgrad_add(const at::Tensor& dy_like, const at::Tensor& w_like,
                              const at::Tensor& other_like, int64_t stride) {
  const Built& b = dgrad_add_graph(dy_like, w_like, other_like, stride);
  return b.graph ? "" : "dgrad-add: " + b.failure;
}

std::string dgrad_add_engine(const at::Tensor& dy_like, const at::Tensor& w_like,
                             const at::Tensor& other_like, int64_t stride) {
  const Built& b = dgrad_add_graph(dy_like, w_like, other_like, stride);
  return "dgrad-add: " + (b.graph ? b.graph->plan_name() : b.failure);
}

at::Tensor dgrad_add(const at::Tensor& dy, const at::Tensor& w, const at::Tensor& other,
                     int64_t stride) {
  const Tensors t = dgrad_add_tensors(dy, w, other);
  run("dgrad_add", declare_dgrad_add, t, stride, at::kFloat);
  return t[kAddDx];
}

}  // namespace trainer::conv_bn_graphs
