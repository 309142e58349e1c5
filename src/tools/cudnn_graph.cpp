#include "src/tools/cudnn_graph.h"

#include <ATen/ATen.h>
#include <ATen/cudnn/Handle.h>

#include <algorithm>

#include "base/check.h"

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
      throw UserError(detail::concat(
          "cudnn-frontend graphs here take half, bfloat16 or float, not ", c10::toString(dtype)));
  }
}

// The dims and strides of `t` for cuDNN: NCHW sizes with the layout's strides when 4-D (NHWC when
// channels_last), (1, C, 1, 1) when 1-D.
void describe(fe::graph::Tensor_attributes& attributes, const at::Tensor& t) {
  if (t.dim() == 4) {
    attributes.set_dim(t.sizes().vec()).set_stride(t.strides().vec());
  } else {
    TORCH_INTERNAL_ASSERT(t.dim() == 1, "a per-channel tensor is 1-D");
    const int64_t c = t.size(0);
    attributes.set_dim({1, c, 1, 1}).set_stride({c, 1, c, c});
  }
  attributes.set_data_type(fe_type(t.scalar_type()));
}

}  // namespace

CudnnGraph::CudnnGraph(at::ScalarType io, at::ScalarType intermediate) {
  graph_.set_io_data_type(fe_type(io))
      .set_intermediate_data_type(fe_type(intermediate))
      .set_compute_data_type(fe::DataType_t::FLOAT);
}

void CudnnGraph::bind(const GraphTensor& node, const at::Tensor& t) {
  TORCH_INTERNAL_ASSERT(t.is_cuda(), "a cuDNN graph's tensor on the CPU");
  pointers_[node] = t.data_ptr();
  tensors_.push_back(t);
}

GraphTensor CudnnGraph::input(const char* name, const at::Tensor& t) {
  auto attributes = fe::graph::Tensor_attributes().set_name(name);
  describe(attributes, t);
  GraphTensor node = graph_.tensor(attributes);
  bind(node, t);
  return node;
}

void CudnnGraph::output(const GraphTensor& node, const at::Tensor& t) {
  describe(*node, t);
  node->set_output(true);
  bind(node, t);
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

std::string CudnnGraph::build() {
  cudnnHandle_t handle = at::native::getCudnnHandle();  // on the current stream
  fe::error_t status = graph_.validate();
  if (status.is_good()) status = graph_.build_operation_graph(handle);
  if (status.is_good())
    status = graph_.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
  if (status.is_good()) status = graph_.check_support(handle);
  if (status.is_good()) status = graph_.build_plans(handle);
  return status.is_good() ? "" : status.get_message();
}

void CudnnGraph::execute() {
  int64_t bytes = 0;
  USER_CHECK(graph_.get_workspace_size(bytes).is_good(), "cudnn-frontend: no workspace size");
  const at::Tensor workspace =
      at::empty({std::max<int64_t>(bytes, 1)}, tensors_.front().options().dtype(at::kByte));
  fe::error_t status =
      graph_.execute(at::native::getCudnnHandle(), pointers_, workspace.data_ptr());
  USER_CHECK(status.is_good(),
             "cudnn-frontend: a built graph failed to run: ", status.get_message());
}

}  // namespace trainer
