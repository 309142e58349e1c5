// The readers of files torch.save wrote: read_torch_save_file (the zip, our rewrite of the pickle
// that reads OrderedDicts, the tensors' storages), and on top of it load_checkpoint and
// read_weights_file, which pick a state dict, the progress and the class names out of it. Any
// bytes are read or refused with an exception that main reports; nothing else.
#include <c10/util/Exception.h>

#include <exception>

#include "base/user_error.h"
#include "src/state/checkpoint.h"
#include "src/state/torch_pickle.h"
#include "src/state/weights.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

// Runs `read`, which may refuse the file with the exceptions train's main reports.
template <typename Read>
void refused_or_read(Read read) {
  try {
    read();
  } catch (const trainer::UserError&) {
  } catch (const c10::Error&) {
  } catch (const std::exception&) {  // the standard library's, from LibTorch's reader
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainer;
  const std::string path =
      fuzz::write_input_file({reinterpret_cast<const char*>(data), size}, ".pt");
  refused_or_read([&] { read_torch_save_file(path, kMaxWeightsFileBytes, "fuzz input"); });
  refused_or_read([&] { load_checkpoint(path); });
  refused_or_read([&] { read_weights_file(path, "weights"); });
  return 0;
}
