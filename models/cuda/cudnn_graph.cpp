#include "models/cuda/cudnn_graph.h"

#include <ATen/ATen.h>
#include <ATen/cudnn/Handle.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>

#include <algorithm>
#include <unordered_map>

#include "base/cudnn_check.h"

namespace trainer {
namespace {

fe::DataType_t fe_type(at::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf:
      return fe::DataType_t::HALF;
    case at::kBFloat16:
      return fe::DataType_t::BFLOAT16;
    case at::kFloat:
      return fe::DataType_t::FLOAT;
    default:
      TORCH_INTERNAL_ASSERT(false, "cudnn-frontend graphs here take half, bfloat16 or float, not ",
                            c10::toString(dtype));
  }
}

// The dims and strides of `t` for cuDNN: NCHW sizes laid out NHWC when 4-D, (1, C, 1, 1) when 1-D.
void describe(fe::graph::Tensor_attributes& attributes, const at::Tensor& t) {
  if (t.dim() == 4) {
    // NHWC strides from the sizes: any channels_last tensor of these sizes has them, but for
    // dimensions of size 1, whose strides ATen leaves free.
    const int64_t c = t.size(1), h = t.size(2), w = t.size(3);
    attributes.set_dim(t.sizes().vec()).set_stride({c * h * w, 1, w * c, c});
  } else {
    TORCH_INTERNAL_ASSERT(t.dim() == 1, "a per-channel tensor is 1-D");
    const int64_t c = t.size(0);
    attributes.set_dim({1, c, 1, 1}).set_stride({c, 1, c, c});
  }
  attributes.set_data_type(fe_type(t.scalar_type()));
}

std::string describe_error(fe::error_t status) {
  return status.is_good() ? "" : status.get_message();
}

// Whether the current stream is being recorded into a CUDA graph, where nothing may synchronize.
bool capturing() {
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}

}  // namespace

CudnnGraph::CudnnGraph(at::ScalarType io, at::ScalarType intermediate, Tensors like)
    : like_(std::move(like)) {
  graph_.set_io_data_type(fe_type(io))
      .set_intermediate_data_type(fe_type(intermediate))
      .set_compute_data_type(fe::DataType_t::FLOAT);
}

GraphTensor CudnnGraph::input(const char* name, size_t slot) {
  auto attributes = fe::graph::Tensor_attributes().set_name(name);
  describe(attributes, like_.at(slot));
  GraphTensor node = graph_.tensor(attributes);
  places_.emplace_back(node, slot);
  return node;
}

void CudnnGraph::output(const GraphTensor& node, size_t slot) {
  describe(*node, like_.at(slot));
  node->set_output(true);
  places_.emplace_back(node, slot);
}

GraphTensor CudnnGraph::pointwise(fe::PointwiseMode_t mode, const GraphTensor& a,
                                  const GraphTensor& b) {
  auto attributes = fe::graph::Pointwise_attributes().set_mode(mode);
  return b ? graph_.pointwise(a, b, attributes) : graph_.pointwise(a, attributes);
}

GraphTensor CudnnGraph::scale_bias_relu(const GraphTensor& x, const GraphTensor& scale,
                                        const GraphTensor& bias) {
  using Mode = fe::PointwiseMode_t;
  return pointwise(Mode::RELU_FWD, pointwise(Mode::ADD, pointwise(Mode::MUL, x, scale), bias));
}

std::string CudnnGraph::validate() { return describe_error(graph_.validate()); }

std::string CudnnGraph::build() {
  if (std::string invalid = validate(); !invalid.empty()) return invalid;
  cudnnHandle_t handle = at::native::getCudnnHandle();  // on the current stream
  fe::error_t status = graph_.build_operation_graph(handle);
  if (!status.is_good()) return status.get_message();
  status = graph_.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
  if (status.is_good()) status = graph_.check_support(handle);
  if (status.is_bad()) {
    // The heuristics do not list every engine that runs a fused graph: offer cuDNN each one.
    int64_t engines = 0;
    if (graph_.get_engine_count(engines).is_good())
      for (int64_t id = 0; id < engines; ++id) (void)graph_.create_execution_plan(id, {});
    status = graph_.check_support(handle);
  }
  if (!status.is_good()) return status.get_message();
  if (!at::globalContext().benchmarkCuDNN() || capturing())
    return describe_error(graph_.build_plans(handle));
  // As ATen picks its convolutions under cudnn_benchmark: every plan built, timed, the fastest run.
  status = graph_.build_plans(handle, fe::BuildPlanPolicy_t::ALL);
  if (status.is_good()) status = autotune(handle);
  return describe_error(status);
}

fe::error_t CudnnGraph::autotune(cudnnHandle_t handle) {
  Tensors scratch;  // real tensors of the declared sizes, for the plans to run on
  for (const at::Tensor& like : like_) {
    if (!like.defined()) {
      scratch.emplace_back();
      continue;
    }
    const auto format =
        like.dim() == 4 ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
    // at::empty, not at::rand: a factory without a memory_format argument ignores the option's.
    scratch.push_back(
        at::empty(like.sizes(), like.options().device(at::kCUDA).memory_format(format))
            .uniform_(0, 1));
  }
  std::unordered_map<GraphTensor, void*> pointers = data_pointers(scratch);
  const at::Tensor workspace =
      at::empty({std::max<int64_t>(graph_.get_autotune_workspace_size(), 1)},
                scratch.at(places_.front().second).options().dtype(at::kByte));
  return graph_.autotune(handle, pointers, workspace.data_ptr());
}

std::unordered_map<GraphTensor, void*> CudnnGraph::data_pointers(const Tensors& tensors) const {
  std::unordered_map<GraphTensor, void*> pointers;
  for (const auto& [node, slot] : places_) {
    const at::Tensor& t = tensors.at(slot);
    const at::Tensor& like = like_[slot];
    TORCH_INTERNAL_ASSERT(t.defined(), "cuDNN graph tensor ", node->get_name(), " (place ", slot,
                          ") not given");
    const bool laid_out =
        (t.dim() == 4 ? t.is_contiguous(at::MemoryFormat::ChannelsLast) : t.is_contiguous());
    TORCH_INTERNAL_ASSERT(
        laid_out && t.is_cuda() && t.sizes() == like.sizes() && t.dtype() == like.dtype(),
        "cuDNN graph tensor ", node->get_name(), " (place ", slot, "): ", t.sizes(), " ",
        t.strides(), " ", t.dtype(), ", declared ", like.sizes(), " ", like.dtype(),
        ", channels_last or 1-D");
    pointers[node] = t.data_ptr();
  }
  return pointers;
}

std::string CudnnGraph::plan_name() const {
  std::string name;
  return graph_.get_plan_name(name).is_good() ? name : "(no plan)";
}

void CudnnGraph::execute(const Tensors& tensors) {
  std::unordered_map<GraphTensor, void*> pointers = data_pointers(tensors);
  int64_t bytes = 0;
  CUDNN_FE_CHECK(graph_.get_workspace_size(bytes));
  const at::Tensor workspace = at::empty(
      {std::max<int64_t>(bytes, 1)}, tensors.at(places_.front().second).options().dtype(at::kByte));
  CUDNN_FE_CHECK(graph_.execute(at::native::getCudnnHandle(), pointers, workspace.data_ptr()));
}

}  // namespace trainer
