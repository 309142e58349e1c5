#include "data/datasets/image_folder.h"

#include <algorithm>
#include <filesystem>

#include "base/user_error.h"

namespace trainer {
namespace fs = std::filesystem;

std::vector<SourceImage> list_image_folder(const std::string& root) {
  std::error_code error;
  USER_CHECK(fs::is_directory(root, error), "'", root, "' is not a directory; expected an ",
             "ImageFolder tree root/<class>/<image>");
  std::vector<std::string> classes;
  for (const auto& entry : fs::directory_iterator(root))
    if (entry.is_directory()) classes.push_back(entry.path().filename().string());
  std::sort(classes.begin(), classes.end());
  std::vector<SourceImage> images;
  for (size_t c = 0; c < classes.size(); ++c) {
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(fs::path(root) / classes[c]))
      if (entry.is_regular_file()) files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    // A class without images would leave its label unused and the class names misaligned
    // (torchvision's ImageFolder refuses one too).
    USER_CHECK(!files.empty(), "class folder '", (fs::path(root) / classes[c]).string(),
               "' holds no images. Fix: add its images, or remove the folder");
    for (const auto& f : files) {
      SourceImage image;
      image.path = f.string();
      image.filename = f.filename().string();
      image.label = static_cast<int64_t>(c) + 1;
      image.synset = classes[c];
      images.push_back(std::move(image));
    }
  }
  USER_CHECK(!images.empty(), "'", root, "' holds no images in class folders (root/<class>/...)");
  return images;
}

}  // namespace trainer
