#include "src/state/weights.h"

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>

#include "base/user_error.h"
#include "src/state/torch_pickle.h"

namespace trainer {
namespace fs = std::filesystem;
namespace {

// torch.save has written zip archives since PyTorch 1.6; before, a bare pickle stream.
bool is_zip(std::ifstream& in) {
  char magic[4] = {};
  in.read(magic, sizeof(magic));
  return in.gcount() == 4 && magic[0] == 'P' && magic[1] == 'K' && magic[2] == 3 && magic[3] == 4;
}

std::string resave_fix(const fs::path& path) {
  return "Fix: save the state dict alone with a recent PyTorch: python -c \"import torch; "
         "torch.save(torch.load('" +
         path.string() +
         "', weights_only=False), 'weights.pth')\" (take ['model'] or "
         "['state_dict'] of a training checkpoint that holds more), and give that file";
}

c10::IValue read_file(const fs::path& path, const std::string& key) {
  std::ifstream in(path, std::ios::binary);
  USER_CHECK(in, key, " = '", path.string(), "' cannot be read: ", std::strerror(errno),
             ". Fix: give the path of a weights file every rank can read");
  USER_CHECK(is_zip(in), key, " = '", path.string(),
             "' is not a torch.save file of PyTorch 1.6 or later (the legacy format, or not a "
             "PyTorch file at all). ",
             resave_fix(path));
  try {
    return read_torch_save_file(path.string(), kMaxWeightsFileBytes, "weights file");
  } catch (const UserError& e) {
    throw UserError(key + ": " + e.what());
  } catch (const std::exception& e) {
    throw UserError(key + " = '" + path.string() + "' holds more than tensors (" +
                    std::string(e.what()).substr(0, 160) + "). " + resave_fix(path));
  }
}

bool holds_dict(const c10::impl::GenericDict& dict, const char* key) {
  return dict.contains(key) && dict.at(key).isGenericDict();
}

TensorMap to_tensors(const c10::impl::GenericDict& dict, const fs::path& path) {
  TensorMap out;
  for (const auto& entry : dict) {
    USER_CHECK(entry.key().isString() && entry.value().isTensor(), "'", path.string(),
               "' is not a state dict: an entry is not a tensor by name. ", resave_fix(path));
    out[entry.key().toStringRef()] = entry.value().toTensor();
  }
  return out;
}

// DistributedDataParallel's state dict names every entry "module.<name>".
TensorMap without_ddp_prefix(TensorMap tensors, std::string& description) {
  const std::string prefix = "module.";
  for (const auto& [name, tensor] : tensors)
    if (name.rfind(prefix, 0) != 0) return tensors;
  TensorMap out;
  for (auto& [name, tensor] : tensors) out[name.substr(prefix.size())] = tensor;
  description += " (DDP's 'module.' prefix removed)";
  return out;
}

}  // namespace

WeightsFile read_weights_file(const fs::path& path, const std::string& key) {
  const c10::IValue value = read_file(path, key);
  USER_CHECK(value.isGenericDict(), key, " = '", path.string(), "' does not hold a dict. ",
             resave_fix(path));
  const auto dict = value.toGenericDict();
  WeightsFile out;
  if (holds_dict(dict, "model") && dict.contains("step") && dict.contains("config")) {
    out.step = dict.at("step").toInt();
    out.description =
        "the model of a checkpoint of this trainer (step " + std::to_string(out.step) + ")";
    out.tensors = to_tensors(dict.at("model").toGenericDict(), path);
    if (dict.contains("architecture")) out.architecture = dict.at("architecture").toStringRef();
    out.classes = read_checkpoint_classes(dict, key + " = '" + path.string() + "'");
  } else if (holds_dict(dict, "state_dict") || holds_dict(dict, "model")) {
    const char* inner = holds_dict(dict, "state_dict") ? "state_dict" : "model";
    out.description = std::string("the state dict under '") + inner + "'";
    out.tensors = to_tensors(dict.at(inner).toGenericDict(), path);
  } else {
    out.description = "a state dict";
    out.tensors = to_tensors(dict, path);
  }
  out.tensors = without_ddp_prefix(std::move(out.tensors), out.description);
  return out;
}

void check_variant(const WeightsFile& file, bool blurpool, const std::string& key, bool strict) {
  const bool file_blurpool = file.architecture.find("-blurpool") != std::string::npos;
  if (file.architecture.empty() || file_blurpool == blurpool) return;
  const std::string message = key + "'s weights are " + file.architecture + "'s, trained " +
                              (file_blurpool ? "with" : "without") + " BlurPool, and this run " +
                              (blurpool ? "has it" : "does not") +
                              ". Fix: blurpool = " + (file_blurpool ? "true" : "false");
  USER_CHECK(!strict, message);
  spdlog::warn(
      "{} (fine-tuning across the variants works, but starts further from the file's "
      "accuracy)",
      message);
}

bool is_classifier_parameter(const std::string& name) { return name.rfind("fc.", 0) == 0; }

bool load_weights(ResNet& model, const TensorMap& weights, const std::string& source,
                  bool keep_new_classifier) {
  std::set<std::string> classifier;
  if (keep_new_classifier)
    for (const auto& item : model->named_parameters())
      if (is_classifier_parameter(item.key())) classifier.insert(item.key());
  return !load_state_dict(*model, weights, source, classifier).empty();
}

}  // namespace trainer
