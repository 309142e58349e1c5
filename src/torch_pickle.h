// Serialises an IValue (dicts of tensors, numbers, strings) in torch.save's zip format, without
// the TorchScript type tags that torch::pickle_save adds to dicts and lists: a tagged file needs
// torch.load(weights_only=False), an untagged one loads with PyTorch's safe default.
#pragma once

#include <ATen/core/ivalue.h>

#include <vector>

namespace trainer {

std::vector<char> pickle_for_python(const c10::IValue& value);

}  // namespace trainer
