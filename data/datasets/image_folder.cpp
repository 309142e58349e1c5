#include "data/datasets/image_folder.h"

#include <jpeglib.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <numeric>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "base/check.h"
#include "data/formats/jpeg/decode.h"
#include "data/formats/tfrecord/image_example.h"
#include "data/formats/tfrecord/index.h"
#include "data/formats/tfrecord/record.h"

namespace trainer {
namespace fs = std::filesystem;

std::vector<FolderImage> list_image_folder(const std::string& root) {
  std::error_code error;
  USER_CHECK(fs::is_directory(root, error), "'", root, "' is not a directory; expected an ",
             "ImageFolder tree root/<class>/<image>");
  std::vector<std::string> classes;
  for (const auto& entry : fs::directory_iterator(root))
    if (entry.is_directory()) classes.push_back(entry.path().filename().string());
  std::sort(classes.begin(), classes.end());
  std::vector<FolderImage> images;
  for (size_t c = 0; c < classes.size(); ++c) {
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(fs::path(root) / classes[c]))
      if (entry.is_regular_file()) files.push_back(entry.path().string());
    std::sort(files.begin(), files.end());
    for (auto& f : files) images.push_back({f, classes[c], static_cast<int64_t>(c) + 1});
  }
  USER_CHECK(!images.empty(), "'", root, "' holds no images in class folders (root/<class>/...)");
  return images;
}

namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  USER_CHECK(in, "cannot read '", path, "'");
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// True for a JPEG whose colour space is CMYK/YCCK (a few ImageNet images): re-encoded as RGB.
bool is_cmyk_jpeg(const std::string& bytes) {
  jpeg_decompress_struct cinfo;
  jpeg_error_mgr err;
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()),
               static_cast<unsigned long>(bytes.size()));
  // The header was already read successfully by encoded_image_size, so this cannot error out.
  jpeg_read_header(&cinfo, TRUE);
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  jpeg_destroy_decompress(&cinfo);
  return cmyk;
}

}  // namespace

std::string image_file_example(const FolderImage& image) {
  ImageExample e;
  e.encoded = read_bytes(image.path);
  std::string error;
  ImageSize size;
  USER_CHECK(encoded_image_size(e.encoded, &size, &error), "'", image.path,
             "' is not a decodable image: ", error);
  const bool jpeg =
      e.encoded.size() > 2 && uint8_t(e.encoded[0]) == 0xFF && uint8_t(e.encoded[1]) == 0xD8;
  if (!jpeg || is_cmyk_jpeg(e.encoded)) {  // the standard format holds RGB JPEGs only
    cv::Mat rgb, bgr;
    USER_CHECK(decode_full(e.encoded, &rgb, &error), "'", image.path, "': ", error);
    cv::cvtColor(rgb, bgr, cv::COLOR_RGB2BGR);
    std::vector<uint8_t> out;
    cv::imencode(".jpg", bgr, out, {cv::IMWRITE_JPEG_QUALITY, 100});
    e.encoded.assign(out.begin(), out.end());
  }
  e.label = image.label;
  e.height = size.height;
  e.width = size.width;
  e.filename = fs::path(image.path).filename().string();
  e.synset = image.synset;
  e.text = image.synset;  // no synset-to-words file: the class name
  e.format = "JPEG";
  return serialize_image_example(e);
}

std::vector<std::string> convert_image_folder(const std::string& root, const std::string& out_dir,
                                              const ConvertOptions& o) {
  USER_CHECK(o.shards > 0 && o.threads > 0, "shards and threads must be > 0");
  std::vector<FolderImage> images = list_image_folder(root);
  std::mt19937_64 rng(o.seed);
  std::shuffle(images.begin(), images.end(), rng);  // every shard holds every class
  fs::create_directories(out_dir);
  std::vector<std::string> paths(o.shards);
  char name[64];
  for (int s = 0; s < o.shards; ++s) {
    std::snprintf(name, sizeof(name), "%s-%05d-of-%05d", o.prefix.c_str(), s, o.shards);
    paths[s] = (fs::path(out_dir) / name).string();
  }
  std::atomic<int> next{0};
  std::mutex error_mutex;
  std::exception_ptr error;
  auto work = [&] {
    try {
      for (int s = next++; s < o.shards; s = next++) {
        RecordWriter writer(paths[s]);
        const size_t begin = images.size() * s / o.shards, end = images.size() * (s + 1) / o.shards;
        for (size_t i = begin; i < end; ++i) writer.write(image_file_example(images[i]));
        writer.close();
        USER_CHECK(write_index_file(paths[s] + ".idx", writer.index()), "cannot write '", paths[s],
                   ".idx'");
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < o.threads; ++t) threads.emplace_back(work);
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
  return paths;
}

}  // namespace trainer
