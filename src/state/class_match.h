// Whether a checkpoint's classes are those of the data it meets: logit i of a model means class i
// of the data it was trained on, so weights resumed, evaluated or fine-tuned on records whose
// labels put other classes at those indices would be trained and scored against the wrong names.
#pragma once

#include <string>
#include <vector>

#include "data/datasets/class_names.h"

namespace trainer {

// Class names with where they come from.
struct NamedClasses {
  std::vector<ClassName> names;  // in label order, names[i] naming class index i; empty: unknown
  std::string file;              // the names file or checkpoint they were read from, for messages
};

// What the weights are used for: each has its own fix.
enum class WeightsUse { kResume, kEvaluate, kInitialise };

// Throws UserError naming the first index whose synset differs, both classes (synset and words)
// and both files, when both sides name their classes. When either side has no names nothing is
// checked, which is logged once per process at info level.
void check_same_classes(const NamedClasses& checkpoint, const NamedClasses& data, WeightsUse use);

// "n01440764 (tench, Tinca tinca)", or the synset alone when it has no words.
std::string describe_class(const ClassName& name);

}  // namespace trainer
