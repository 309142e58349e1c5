// Serialises an IValue (dicts of tensors, numbers, strings) in torch.save's zip format, without
// the TorchScript type tags that torch::pickle_save adds to dicts and lists: a tagged file needs
// torch.load(weights_only=False), an untagged one loads with PyTorch's safe default.
#pragma once

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>
#include <vector>

namespace trainer {

std::vector<char> pickle_for_python(const c10::IValue& value);

// The largest file of weights read: torchvision's ResNet-50 weights are ~100 MB, its largest
// ResNet's (wide_resnet101_2) ~500 MB; a larger one is not weights for this trainer.
constexpr int64_t kMaxWeightsFileBytes = int64_t(2) << 30;
// The largest checkpoint read: a ResNet-50 checkpoint (model, momentum, EMA) is ~300 MB.
constexpr int64_t kMaxCheckpointBytes = int64_t(4) << 30;

// Reads a file torch.save wrote (the zip format of PyTorch 1.6 and later) holding dicts, lists,
// tuples, numbers, strings and tensors (CPU). Unlike torch::jit::pickle_load it reads the
// OrderedDict that state_dict() returns, as a dict. Throws c10::Error on anything else, and
// UserError (naming `what`, the path) when the file is over `max_file_bytes`, when a zip entry
// claims more bytes than the file holds after it (torch.save stores entries uncompressed), or a
// tensor reaches past the bytes stored for it: each checked before anything of that size is
// allocated or read, so no tensor is larger than the file.
c10::IValue read_torch_save_file(const std::string& path, int64_t max_file_bytes,
                                 const std::string& what);

}  // namespace trainer
