#include "data/datasets/record_classes.h"

#include "base/user_error.h"

namespace trainer {

void RecordClasses::add(int64_t label, const std::string& synset, const std::string& text,
                        const std::string& where) {
  if (synset.empty()) return;
  auto [it, inserted] = by_label_.try_emplace(label, Seen{{synset, text}, where});
  if (inserted) return;
  // Words may be missing from some records; the synset is what names the class.
  USER_CHECK(it->second.name.synset == synset, "label ", label,
             " names two classes: ", it->second.name.synset, " in ", it->second.where, " and ",
             synset, " in ", where,
             ". Fix: the records were written from inconsistent class lists; rewrite them with ",
             "one (make-tfrecords), or write synsets.txt by hand");
  if (it->second.name.text.empty()) it->second.name.text = text;
}

void RecordClasses::merge(const RecordClasses& other) {
  for (const auto& [label, seen] : other.by_label_)
    add(label, seen.name.synset, seen.name.text, seen.where);
}

std::vector<ClassName> RecordClasses::ordered(std::string* gap) const {
  std::vector<ClassName> out;
  gap->clear();
  int64_t expected = by_label_.empty() ? 0 : by_label_.begin()->first;
  for (const auto& [label, seen] : by_label_) {
    if (label != expected && gap->empty()) *gap = std::to_string(expected);
    expected = label + 1;
    out.push_back(seen.name);
  }
  return out;
}

}  // namespace trainer
