// A small labelled JPEG dataset for smoke runs, tests and benchmarks: ImageNet-like sizes
// (default 500x375, some portrait) and encoding (quality 90, 4:2:0), learnable classes (a hue and
// a stripe orientation per class, random phase and noise per image), as an ImageFolder tree or
// directly as standard ImageNet TFRecord shards with index files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainer {

struct JpegDatasetOptions {
  int classes = 10;
  int images_per_class = 20;
  int width = 500;
  int height = 375;
  int quality = 90;
  uint64_t seed = 0;
};

// The JPEG bytes of image `index` of class `label` (0-based).
std::string generate_jpeg(int label, int index, const JpegDatasetOptions& options);

// Writes out_dir/class_NNN/image_NNNNN.jpg; returns the number of images.
int64_t write_jpeg_folder(const std::string& out_dir, const JpegDatasetOptions& options);

// Writes out_dir/<prefix>-NNNNN-of-MMMMM (+ .idx): labels 1-based, classes class_NNN.
std::vector<std::string> write_jpeg_tfrecords(const std::string& out_dir, const std::string& prefix,
                                              int shards, const JpegDatasetOptions& options);

}  // namespace trainer
