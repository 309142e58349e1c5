// Serialises an IValue (dicts of tensors, numbers, strings) in torch.save's zip format, without
// the TorchScript type tags that torch::pickle_save adds to dicts and lists: a tagged file needs
// torch.load(weights_only=False), an untagged one loads with PyTorch's safe default.
#pragma once

#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

namespace trainer {

std::vector<char> pickle_for_python(const c10::IValue& value);

// Reads a file torch.save wrote (the zip format of PyTorch 1.6 and later) holding dicts, lists,
// tuples, numbers, strings and tensors (CPU). Unlike torch::jit::pickle_load it reads the
// OrderedDict that state_dict() returns, as a dict. Throws c10::Error on anything else.
c10::IValue read_torch_save_file(const std::string& path);

}  // namespace trainer
