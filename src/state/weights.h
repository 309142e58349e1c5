// Weights from a file, to evaluate or to start a run from: a state dict saved by PyTorch
// (`torch.save(model.state_dict(), f)`, the format of torchvision's published weights, also
// wrapped as {"state_dict": ...} or {"model": ...}, with or without DDP's "module." prefix), or one
// of this trainer's checkpoints (its "model").
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "models/resnet.h"
#include "src/state/checkpoint.h"

namespace trainer {

struct WeightsFile {
  TensorMap tensors;        // parameters and buffers by torchvision name, CPU
  std::string description;  // what the file held, for the log: "a torchvision state dict", ...
  int64_t step = 0;         // the training step of a checkpoint of ours; 0 otherwise
  // A checkpoint's architecture ("resnet50", "resnet50-blurpool"); "" when the file does not say.
  std::string architecture;
  // A checkpoint's class names, logit i being classes[i]; empty when the file has none.
  std::vector<ClassName> classes;
};

// Whether `file` holds weights for the model variant this run builds: a BlurPool checkpoint into a
// plain model (or the reverse) loads without a shape error but computes something else. Throws
// UserError naming `key` and the fix when `strict` (evaluation), else logs a warning.
void check_variant(const WeightsFile& file, bool blurpool, const std::string& key, bool strict);

// Reads `path`; `key` names the config key that gave it, for errors (each names the file and
// the fix).
WeightsFile read_weights_file(const std::filesystem::path& path, const std::string& key);

// Classifier parameters: the layer that depends on num_classes.
bool is_classifier_parameter(const std::string& name);

// Copies `weights` into `model`. Every parameter and buffer must be present with its shape (the
// error names `source`, the first that is not, and both shapes), except, when
// `keep_new_classifier`, the classifier when its width differs from the file's: it keeps its
// fresh initialisation. Returns whether the classifier was kept.
bool load_weights(ResNet& model, const TensorMap& weights, const std::string& source,
                  bool keep_new_classifier);

}  // namespace trainer
