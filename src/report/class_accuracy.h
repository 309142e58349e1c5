// Top-1 per class of an evaluation, for the log: the classes the model gets wrong most often,
// named when the run has class names (data/datasets/class_names.h), by index otherwise.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/datasets/class_names.h"

namespace trainer {

struct ClassAccuracy {
  int64_t index = 0;    // class index (label - label_offset)
  int64_t images = 0;   // evaluated images of the class
  int64_t correct = 0;  // of which top-1 was right
  double top1() const { return images ? 100.0 * correct / images : 0.0; }  // percent
};

// The `count` classes with the lowest top-1, lowest first (ties: lower index first); classes
// without images are left out. `images` and `correct` are per class index.
std::vector<ClassAccuracy> worst_classes(const std::vector<int64_t>& images,
                                         const std::vector<int64_t>& correct, size_t count);

// "3 n01443537 (goldfish) 20.00% (1/5); 7 ..." with `names` (when not empty), else indices.
std::string describe_classes(const std::vector<ClassAccuracy>& classes,
                             const std::vector<ClassName>& names);

}  // namespace trainer
