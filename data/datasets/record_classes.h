// The class names a dataset's records carry (image/class/synset and image/class/text, as
// TensorFlow's build_imagenet_data.py writes them), gathered record by record into the lines of
// a class names file (data/datasets/class_names.h): the classes ordered by stored label, lowest
// first, so line 1 is the lowest label (class 0 once label_offset is subtracted).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "data/datasets/class_names.h"

namespace trainer {

class RecordClasses {
 public:
  // One record of `label` naming `synset` (and its words `text`); `where` names the record
  // ("file at byte N") for the error when another record of the label named another synset.
  // Records without a synset are not counted. Throws UserError on such a conflict.
  void add(int64_t label, const std::string& synset, const std::string& text,
           const std::string& where);
  // Merges what another collector saw (of other files), with the same conflict check.
  void merge(const RecordClasses& other);

  bool empty() const { return by_label_.empty(); }
  int64_t lowest_label() const { return by_label_.empty() ? 0 : by_label_.begin()->first; }
  // The classes by stored label, lowest first. `gap` gets "" when the labels are consecutive,
  // else the first label missing between the lowest and the highest (a file with a line missing
  // would shift every later class onto the wrong index).
  std::vector<ClassName> ordered(std::string* gap) const;

 private:
  struct Seen {
    ClassName name;
    std::string where;  // the first record that named it
  };
  std::map<int64_t, Seen> by_label_;
};

}  // namespace trainer
