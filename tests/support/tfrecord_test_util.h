// Helpers of the TFRecord tests: small TFRecord datasets written with the project's own writer, in
// TensorFlow's layout or TFDS's.
#pragma once

#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "data/datasets/jpeg_dataset.h"
#include "data/formats/tfrecord/image_example.h"
#include "data/formats/tfrecord/index.h"
#include "data/formats/tfrecord/record.h"
#include "tests/support/temp_dir.h"

namespace trainer::testing {

// A tf.train.Example written field by field (protobuf's wire format), for layouts the project's
// own writer never produces: each feature a (name, Feature) pair of bytes_feature/int64_feature.
namespace wire {
inline std::string varint(uint64_t v) {
  std::string out;
  for (; v >= 0x80; v >>= 7) out += static_cast<char>(v | 0x80);
  return out + static_cast<char>(v);
}
inline std::string field(int number, const std::string& bytes) {  // length-delimited
  return varint(uint64_t(number) << 3 | 2) + varint(bytes.size()) + bytes;
}
inline std::string bytes_feature(const std::string& value) { return field(1, field(1, value)); }
inline std::string int64_feature(int64_t value) {  // a packed list of one
  return field(3, field(1, varint(static_cast<uint64_t>(value))));
}
inline std::string example(const std::vector<std::pair<std::string, std::string>>& features) {
  std::string map;  // each map entry: key = 1, value = 2
  for (const auto& [key, feature] : features) map += field(1, field(1, key) + field(2, feature));
  return field(1, map);
}
}  // namespace wire

// A record as TensorFlow Datasets' imagenet2012 writes it: image, label (0..999), file_name.
inline std::string tfds_example(const std::string& jpeg, int64_t label,
                                const std::string& file_name) {
  return wire::example({{"file_name", wire::bytes_feature(file_name)},
                        {"image", wire::bytes_feature(jpeg)},
                        {"label", wire::int64_feature(label)}});
}

// Writes `files` shards of small JPEG images (record n has stored label n % classes + 1 and the
// filename "n") without index files; returns the shard paths. `counts` gives records per file.
// With `tfds`, the same images in TFDS's layout and file names
// (imagenet2012-train.tfrecord-00000-of-00003) with labels 0-based: n % classes.
inline std::vector<std::string> write_dataset(const TempDir& dir, const std::vector<int>& counts,
                                              int classes = 10, int size = 48, bool tfds = false) {
  JpegDatasetOptions jpeg;
  jpeg.classes = classes;
  jpeg.width = size;
  jpeg.height = size * 3 / 4;
  std::vector<std::string> paths;
  int n = 0;
  for (size_t f = 0; f < counts.size(); ++f) {
    char tfds_name[64];
    std::snprintf(tfds_name, sizeof tfds_name, "imagenet2012-train.tfrecord-%05zu-of-%05zu", f,
                  counts.size());
    paths.push_back(dir.file(tfds ? tfds_name : "train-" + std::to_string(10000 + f)));
    RecordWriter writer(paths.back());
    for (int i = 0; i < counts[f]; ++i, ++n) {
      ImageExample e;
      e.encoded = generate_jpeg(n % classes, n, jpeg);
      e.label = n % classes + 1;
      e.filename = std::to_string(n);
      writer.write(tfds ? tfds_example(e.encoded, e.label - 1, e.filename)
                        : serialize_image_example(e));
    }
    writer.close();
  }
  return paths;
}

}  // namespace trainer::testing
