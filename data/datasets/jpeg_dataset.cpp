#include "data/datasets/jpeg_dataset.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <random>

#include "base/seed.h"
#include "base/user_error.h"
#include "data/formats/jpeg/decode.h"
#include "data/formats/tfrecord/image_example.h"
#include "data/formats/tfrecord/index.h"
#include "data/formats/tfrecord/record.h"

namespace trainer {
namespace fs = std::filesystem;

namespace {

std::string class_name(int label) {
  char name[32];
  std::snprintf(name, sizeof(name), "class_%03d", label);
  return name;
}

}  // namespace

std::string generate_jpeg(int label, int index, const JpegDatasetOptions& o) {
  std::mt19937_64 rng(
      mix_seed(mix_seed(o.seed, static_cast<uint64_t>(label)), static_cast<uint64_t>(index)));
  // A quarter of ImageNet is portrait: swap the sides for some images.
  const bool portrait = (rng() & 3) == 0;
  const int w = portrait ? o.height : o.width, h = portrait ? o.width : o.height;
  const double k = o.classes, c = label;
  const double angle = M_PI * c / k, frequency = 4 + label % 4;
  const double phase = 2 * M_PI * uniform01(rng);
  const double ca = std::cos(angle), sa = std::sin(angle);
  double colour[3];
  for (int ch = 0; ch < 3; ++ch)
    colour[ch] = 128 + 70 * std::cos(2 * M_PI * c / k + ch * 2 * M_PI / 3);
  std::normal_distribution<float> noise(0.f, 12.f);
  cv::Mat bgr(h, w, CV_8UC3);
  const double scale = 1.0 / std::max(w, h);
  for (int y = 0; y < h; ++y) {
    auto* row = bgr.ptr<uint8_t>(y);
    for (int x = 0; x < w; ++x) {
      const double stripes = std::sin(2 * M_PI * frequency * (x * ca + y * sa) * scale + phase);
      for (int ch = 0; ch < 3; ++ch) {
        const double v = colour[ch] + 50 * stripes + noise(rng);
        row[x * 3 + (2 - ch)] = static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
      }
    }
  }
  std::vector<uint8_t> jpeg;
  // OpenCV leaves libjpeg's default chroma subsampling for colour images: 4:2:0, as ImageNet's.
  cv::imencode(".jpg", bgr, jpeg, {cv::IMWRITE_JPEG_QUALITY, o.quality});
  return std::string(jpeg.begin(), jpeg.end());
}

int64_t write_jpeg_folder(const std::string& out_dir, const JpegDatasetOptions& o) {
  int64_t count = 0;
  for (int label = 0; label < o.classes; ++label) {
    const fs::path dir = fs::path(out_dir) / class_name(label);
    fs::create_directories(dir);
    for (int i = 0; i < o.images_per_class; ++i, ++count) {
      char name[32];
      std::snprintf(name, sizeof(name), "image_%05d.jpg", i);
      std::ofstream out(dir / name, std::ios::binary);
      const std::string bytes = generate_jpeg(label, i, o);
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      USER_CHECK(out, "cannot write ", (dir / name).string());
    }
  }
  return count;
}

std::vector<std::string> write_jpeg_tfrecords(const std::string& out_dir, const std::string& prefix,
                                              int shards, const JpegDatasetOptions& o) {
  USER_CHECK(shards > 0, "shards must be > 0");
  fs::create_directories(out_dir);
  const int64_t total = int64_t(o.classes) * o.images_per_class;
  std::vector<std::string> paths;
  for (int s = 0; s < shards; ++s) {
    char name[96];
    std::snprintf(name, sizeof(name), "%s-%05d-of-%05d", prefix.c_str(), s, shards);
    paths.push_back((fs::path(out_dir) / name).string());
    RecordWriter writer(paths.back());
    // Image n of the dataset is class n % classes: every shard holds every class.
    for (int64_t n = total * s / shards; n < total * (s + 1) / shards; ++n) {
      const int label = static_cast<int>(n % o.classes), index = static_cast<int>(n / o.classes);
      ImageExample e;
      e.encoded = generate_jpeg(label, index, o);
      ImageSize size;
      std::string error;
      USER_CHECK(encoded_image_size(e.encoded, &size, &error), "generated JPEG: ", error);
      e.width = size.width;
      e.height = size.height;
      e.label = label + 1;
      e.synset = e.text = class_name(label);
      char file[32];
      std::snprintf(file, sizeof(file), "image_%05d.jpg", index);
      e.filename = file;
      writer.write(serialize_image_example(e));
    }
    writer.close();
    USER_CHECK(write_index_file(paths.back() + ".idx", writer.index()), "cannot write index");
  }
  return paths;
}

}  // namespace trainer
