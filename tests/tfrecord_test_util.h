// Helpers of the TFRecord tests: a temporary folder removed at the end, and small TFRecord
// datasets written with the project's own writer.
#pragma once

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "data/datasets/jpeg_dataset.h"
#include "data/formats/tfrecord/image_example.h"
#include "data/formats/tfrecord/index.h"
#include "data/formats/tfrecord/record.h"

namespace trainer::testing {

class TempDir {
 public:
  TempDir() {
    std::random_device random;
    path_ = std::filesystem::temp_directory_path() /
            ("tfrecord-test-" + std::to_string(random()) + std::to_string(random()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Writes `files` shards of small JPEG images (record n has stored label n % classes + 1 and the
// filename "n") without index files; returns the shard paths. `counts` gives records per file.
inline std::vector<std::string> write_dataset(const TempDir& dir, const std::vector<int>& counts,
                                              int classes = 10, int size = 48) {
  JpegDatasetOptions jpeg;
  jpeg.classes = classes;
  jpeg.width = size;
  jpeg.height = size * 3 / 4;
  std::vector<std::string> paths;
  int n = 0;
  for (size_t f = 0; f < counts.size(); ++f) {
    paths.push_back(dir.file("train-" + std::to_string(10000 + f)));
    RecordWriter writer(paths.back());
    for (int i = 0; i < counts[f]; ++i, ++n) {
      ImageExample e;
      e.encoded = generate_jpeg(n % classes, n, jpeg);
      e.label = n % classes + 1;
      e.filename = std::to_string(n);
      writer.write(serialize_image_example(e));
    }
    writer.close();
  }
  return paths;
}

}  // namespace trainer::testing
