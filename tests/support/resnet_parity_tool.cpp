// Test helper for tests/models/test_torchvision_parity.py: moves weights and logits between this
// project's ResNet and Python, through files that torch.load / torch.save read and write.
//   resnet_parity_tool export  ARCH CLASSES OUT  -> {"model": state_dict, "input", "logits"}
//   resnet_parity_tool forward ARCH CLASSES IN OUT: IN = {"model", "input"} -> {"logits"}
// ARCH: resnet18 ... resnet152, or with "-blurpool" the BlurPool variant.
// Logits are computed in eval mode (BN running statistics), fp32, on the CPU.
#include <torch/torch.h>

#include <iostream>

#include "models/resnet.h"
#include "src/state/checkpoint.h"
#include "tests/support/tensor_files.h"

using namespace trainer;

namespace {

at::Tensor eval_logits(ResNet& model, const at::Tensor& input) {
  torch::NoGradGuard no_grad;
  model->eval();
  return model->forward(input);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::cerr << "usage: resnet_parity_tool export|forward ARCH CLASSES [IN] OUT\n";
    return 2;
  }
  const std::string mode = argv[1];
  torch::manual_seed(0);
  // ARCH may name the BlurPool variant: "resnet18-blurpool".
  std::string arch = argv[2];
  const size_t variant = arch.find("-blurpool");
  const bool blurpool = variant != std::string::npos;
  if (blurpool) arch.resize(variant);
  ResNet model(ResNetOptions{resnet_depth_from_name(arch), std::stoll(argv[3]), false, blurpool});
  if (mode == "export") {
    // Non-trivial BN statistics: a few training-mode forwards update the running mean/var.
    for (int i = 0; i < 3; ++i) model->forward(torch::randn({4, 3, 64, 64}) * 2 + 0.5);
    at::Tensor input = torch::randn({2, 3, 64, 64});
    c10::Dict<std::string, at::Tensor> out;
    for (const auto& [name, tensor] : state_dict(*model)) out.insert(name, tensor);
    write_tensors(argv[4], out);
    c10::Dict<std::string, at::Tensor> io;
    io.insert("input", input);
    io.insert("logits", eval_logits(model, input));
    write_tensors(std::string(argv[4]) + ".io", io);
    return 0;
  }
  if (mode == "forward" && argc == 6) {
    auto in = read_dict(argv[4]);
    TensorMap weights;
    for (const auto& entry : in.at("model").toGenericDict())
      weights[entry.key().toStringRef()] = entry.value().toTensor();
    load_state_dict(*model, weights);
    c10::Dict<std::string, at::Tensor> out;
    out.insert("logits", eval_logits(model, in.at("input").toTensor()));
    write_tensors(argv[5], out);
    return 0;
  }
  std::cerr << "unknown mode " << mode << "\n";
  return 2;
}
