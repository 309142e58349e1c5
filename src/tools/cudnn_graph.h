// A cudnn-frontend graph bound to ATen tensors: the graph's tensors are declared from the tensors
// that will hold them (4-D ones channels_last, per-channel ones 1-D (C), seen by cuDNN as
// (1, C, 1, 1)), built for this GPU, and run on the current stream with a workspace from
// LibTorch's allocator.
#pragma once

#include <ATen/core/Tensor.h>
#include <cudnn_frontend.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace trainer {

namespace fe = cudnn_frontend;
using GraphTensor = std::shared_ptr<fe::graph::Tensor_attributes>;

class CudnnGraph {
 public:
  // io: the dtype of the graph's activations; intermediate: of the values between its nodes.
  CudnnGraph(at::ScalarType io, at::ScalarType intermediate);

  fe::graph::Graph& graph() { return graph_; }
  // A tensor of the graph that `t` holds (t must outlive this object's use).
  GraphTensor input(const char* name, const at::Tensor& t);
  // Marks `node` an output that `t` receives, in t's dtype.
  void output(const GraphTensor& node, const at::Tensor& t);
  GraphTensor pointwise(fe::PointwiseMode_t mode, const GraphTensor& a,
                        const GraphTensor& b = nullptr);
  // relu(x * scale + bias): a batch norm applied as its per-channel scale and bias, then ReLU.
  GraphTensor scale_bias_relu(const GraphTensor& x, const GraphTensor& scale,
                              const GraphTensor& bias);

  // Builds the graph for this GPU: "" when cuDNN has an engine for it, else cuDNN's reason.
  std::string build();
  // Runs the built graph on the bound tensors, on the current stream.
  void execute();

 private:
  void bind(const GraphTensor& node, const at::Tensor& t);

  fe::graph::Graph graph_;
  std::unordered_map<GraphTensor, void*> pointers_;
  std::vector<at::Tensor> tensors_;  // what pointers_ point into
};

}  // namespace trainer
