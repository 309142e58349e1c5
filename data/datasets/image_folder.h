// ImageFolder trees (`root/<class>/<image>`, the layout torchvision's ImageFolder reads and
// Kaggle's ImageNet train folder has): the images to convert, classes in sorted order, labels
// 1-based as in the standard ImageNet TFRecords.
#pragma once

#include <string>
#include <vector>

#include "data/datasets/record_shards.h"

namespace trainer {

// Every regular file under `root/<class>/`, classes and files sorted; synset = the class folder's
// name. UserError when there are none, or a class folder holds none.
std::vector<SourceImage> list_image_folder(const std::string& root);

}  // namespace trainer
