// A cudnn-frontend graph over a list of ATen tensors: each of the graph's tensors is declared as
// one place in the list (4-D ones channels_last, per-channel ones 1-D (C), seen by cuDNN as
// (1, C, 1, 1)); the graph is built for this GPU from the list it was declared with (meta tensors
// will do: only sizes and dtypes are read), and run on the current stream, with a workspace from
// LibTorch's allocator, on any list of the same sizes and dtypes in those places.
#pragma once

#include <ATen/core/Tensor.h>
#include <cudnn_frontend.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace trainer {

namespace fe = cudnn_frontend;
using GraphTensor = std::shared_ptr<fe::graph::Tensor_attributes>;

class CudnnGraph {
 public:
  using Tensors = std::vector<at::Tensor>;

  // io: the dtype of the graph's activations; intermediate: of the values between its nodes.
  // like: the list the graph's tensors are declared from (undefined places are not its).
  CudnnGraph(at::ScalarType io, at::ScalarType intermediate, Tensors like);

  fe::graph::Graph& graph() { return graph_; }
  // The graph's tensor at place `slot` of the list.
  GraphTensor input(const char* name, size_t slot);
  // Marks `node` an output, written to place `slot` of the list in that tensor's dtype.
  void output(const GraphTensor& node, size_t slot);
  GraphTensor pointwise(fe::PointwiseMode_t mode, const GraphTensor& a,
                        const GraphTensor& b = nullptr);
  // relu(x * scale + bias): a batch norm applied as its per-channel scale and bias, then ReLU.
  GraphTensor scale_bias_relu(const GraphTensor& x, const GraphTensor& scale,
                              const GraphTensor& bias);

  // Checks the declared graph on the host (no GPU): "" when complete and consistent, else why.
  std::string validate();
  // Builds the graph for this GPU: "" when cuDNN has an engine for it, else cuDNN's reason.
  // Under cudnn_benchmark (ATen's autotuning switch), every plan cuDNN offers is built and timed
  // on scratch tensors of the declared sizes, and the fastest runs; else the heuristics' first.
  std::string build();
  // Runs the built graph on `tensors`, a list like the declared one in every place the graph
  // uses (sizes and dtypes checked; 4-D ones channels_last), on the CUDA device.
  void execute(const Tensors& tensors);
  // The name of the engine and knobs a built graph runs, as cuDNN gives it.
  std::string plan_name() const;

 private:
  fe::error_t autotune(cudnnHandle_t handle);
  // The graph's tensors' addresses in `tensors`, each checked against its declaration.
  std::unordered_map<GraphTensor, void*> data_pointers(const Tensors& tensors) const;

  fe::graph::Graph graph_;
  Tensors like_;
  std::vector<std::pair<GraphTensor, size_t>> places_;  // each declared tensor's place in the list
};

}  // namespace trainer
