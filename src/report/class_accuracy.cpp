#include "src/report/class_accuracy.h"

#include <fmt/format.h>

#include <algorithm>

namespace trainer {

std::vector<ClassAccuracy> worst_classes(const std::vector<int64_t>& images,
                                         const std::vector<int64_t>& correct, size_t count) {
  std::vector<ClassAccuracy> all;
  for (size_t i = 0; i < images.size() && i < correct.size(); ++i)
    if (images[i] > 0) all.push_back({static_cast<int64_t>(i), images[i], correct[i]});
  // a/b < c/d without rounding: a*d < c*b (counts far below 2^31 each).
  auto worse = [](const ClassAccuracy& a, const ClassAccuracy& b) {
    const int64_t left = a.correct * b.images, right = b.correct * a.images;
    return left != right ? left < right : a.index < b.index;
  };
  const size_t n = std::min(count, all.size());
  std::partial_sort(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n), all.end(), worse);
  all.resize(n);
  return all;
}

std::string describe_classes(const std::vector<ClassAccuracy>& classes,
                             const std::vector<ClassName>& names) {
  std::string out;
  for (const ClassAccuracy& c : classes) {
    std::string name;
    if (c.index < static_cast<int64_t>(names.size())) {
      const ClassName& n = names[static_cast<size_t>(c.index)];
      name = " " + n.synset + (n.text.empty() ? "" : " (" + n.text + ")");
    }
    out += fmt::format("{}{}{} {:.2f}% ({}/{})", out.empty() ? "" : "; ", c.index, name, c.top1(),
                       c.correct, c.images);
  }
  return out;
}

}  // namespace trainer
