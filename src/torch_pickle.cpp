#include "src/torch_pickle.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

namespace trainer {

// torch::jit::pickle_save, with tag_aggregates = false.
std::vector<char> pickle_for_python(const c10::IValue& value) {
  std::vector<char> pickle_data;
  torch::jit::Pickler pickler(
      [&](const char* bytes, size_t size) {
        pickle_data.insert(pickle_data.end(), bytes, bytes + size);
      },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();

  std::vector<char> archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
    const char* bytes = static_cast<const char*>(data);
    archive.insert(archive.end(), bytes, bytes + size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickle_data.data(), pickle_data.size(),
                                     pickler.tensorData(), writer);
  writer.writeEndOfFile();
  return archive;
}

}  // namespace trainer
