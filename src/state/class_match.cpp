#include "src/state/class_match.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>

#include "base/user_error.h"

namespace trainer {
namespace {

// The first index at which `a` and `b` name different synsets (or one list ends); -1: none.
int64_t first_mismatch(const std::vector<ClassName>& a, const std::vector<ClassName>& b) {
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i)
    if (i >= a.size() || i >= b.size() || a[i].synset != b[i].synset)
      return static_cast<int64_t>(i);
  return -1;
}

std::string class_at(const std::vector<ClassName>& names, int64_t index) {
  return index < static_cast<int64_t>(names.size())
             ? describe_class(names[index])
             : "missing (it has " + std::to_string(names.size()) + " classes)";
}

std::string fix_for(WeightsUse use) {
  if (use == WeightsUse::kInitialise)
    return "give class_names_file the file the weights were trained with if it is the same "
           "classes in another order, else, to fine-tune on these classes on purpose, start from "
           "the weights' state dict (scripts/export.py writes model_state_dict.pt), which names no "
           "classes";
  return "point val_data" + std::string(use == WeightsUse::kResume ? " and train_data" : "") +
         " at the data the checkpoint was trained on, or set class_names_file to its class list "
         "if the records are the same and only the names file is wrong";
}

}  // namespace

std::string describe_class(const ClassName& name) {
  return name.text.empty() ? name.synset : name.synset + " (" + name.text + ")";
}

void check_same_classes(const NamedClasses& checkpoint, const NamedClasses& data, WeightsUse use) {
  if (checkpoint.names.empty() || data.names.empty()) {
    static std::atomic<bool> said{false};
    if (!said.exchange(true))
      spdlog::info("class names not checked against {}: {} names no classes", checkpoint.file,
                   checkpoint.names.empty() ? "the weights file" : "the data");
    return;
  }
  const int64_t at = first_mismatch(checkpoint.names, data.names);
  USER_CHECK(at < 0, "class ", at, " of the weights in ", checkpoint.file, " is ",
             class_at(checkpoint.names, at), " but class ", at, " of the data is ",
             class_at(data.names, at), " (", data.file,
             "): the weights were trained with another label order, so their predictions "
             "would be scored against the wrong classes. Fix: ",
             fix_for(use));
}

}  // namespace trainer
