// ImageFolder trees (`root/<class>/<image>`, ImageNet's train layout) to sharded TFRecords in the
// standard ImageNet format: classes in sorted order, labels 1-based, shards named
// `<prefix>-00000-of-00128`, each with its DALI index file, written in parallel.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainer {

struct FolderImage {
  std::string path;
  std::string synset;  // the class folder's name
  int64_t label = 0;   // 1-based index of the class in sorted order
};

// Every regular file under `root/<class>/`, classes and files sorted. UserError when empty.
std::vector<FolderImage> list_image_folder(const std::string& root);

struct ConvertOptions {
  std::string prefix = "train";  // shard names: <prefix>-NNNNN-of-MMMMM
  int shards = 16;
  int threads = 2;
  uint64_t seed = 12345;  // images are shuffled across shards (as build_imagenet_data.py does)
};

// Writes the shards (and `.idx` files) into `out_dir`; returns the shard paths. Non-JPEG inputs
// (PNG) and CMYK JPEGs are re-encoded as RGB JPEG, the rest stored byte for byte.
std::vector<std::string> convert_image_folder(const std::string& root, const std::string& out_dir,
                                              const ConvertOptions& options);

// The serialized Example of one image file (what the converter stores).
std::string image_file_example(const FolderImage& image);

}  // namespace trainer
