// The test tools' exchange with Python: dicts of tensors in the files torch.save writes and
// torch.load reads (pickles as LibTorch writes them for Python).
#pragma once

#include <ATen/core/Dict.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "src/state/torch_pickle.h"

namespace trainer {

inline void write_tensors(const std::string& path,
                          const c10::Dict<std::string, at::Tensor>& tensors) {
  const std::vector<char> bytes = pickle_for_python(c10::IValue(tensors));
  std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
}

inline c10::impl::GenericDict read_dict(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return torch::jit::pickle_load(bytes).toGenericDict();
}

}  // namespace trainer
