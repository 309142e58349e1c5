// ImageNet 2012 as it is downloaded, listed as the images make-tfrecords converts, labelled as
// TensorFlow's build_imagenet_data.py labels them (1-based, in sorted WNID order: torchvision's
// ImageNet target + 1), without unpacking anything to disk. Two downloads:
//
//  - image-net.org: ILSVRC2012_img_train.tar (one inner tar per class, named by its WNID),
//    ILSVRC2012_img_val.tar (50,000 JPEGs, flat) and ILSVRC2012_devkit_t12.tar.gz, whose
//    data/meta.mat names the 1,000 classes (the synsets without children, by ILSVRC2012_ID) and
//    whose data/ILSVRC2012_validation_ground_truth.txt gives the validation images' IDs in
//    file-name order: what torchvision.datasets.ImageNet parses.
//  - Kaggle's ImageNet Object Localization Challenge: ILSVRC/Data/CLS-LOC/train/<WNID>/,
//    ILSVRC/Data/CLS-LOC/val/ (flat), LOC_synset_mapping.txt (the classes, sorted),
//    LOC_val_solution.csv (each validation image's class and boxes) and LOC_train_solution.csv
//    (boxes for part of the training images).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/datasets/class_names.h"
#include "data/datasets/record_shards.h"

namespace trainer {

struct ImageNetSplit {
  std::string name;  // "train" or "validation": the shards' prefix
  std::vector<SourceImage> images;
  int64_t full_count = 0;  // the images ImageNet 2012 has in this split
};

struct ImageNetDownload {
  std::string layout;              // "image-net.org" or "Kaggle"
  std::vector<ClassName> classes;  // label order: classes[i] is label i + 1
  std::vector<ImageNetSplit> splits;
};

inline constexpr int64_t kImageNetTrainImages = 1281167;
inline constexpr int64_t kImageNetValidationImages = 50000;

// Finds which download `dir` holds and lists its images (of a tar, only its headers are read),
// with `threads` threads. UserError naming the file and the fix when something is missing or
// inconsistent (a class folder or inner tar whose WNID is not one of the classes, a validation
// image without a class).
ImageNetDownload list_imagenet_download(const std::string& dir, int threads);

}  // namespace trainer
