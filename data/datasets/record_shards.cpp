#include "data/datasets/record_shards.h"

#include <jpeglib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "base/user_error.h"
#include "data/formats/jpeg/decode.h"
#include "data/formats/tfrecord/file.h"
#include "data/formats/tfrecord/image_example.h"
#include "data/formats/tfrecord/index.h"
#include "data/formats/tfrecord/record.h"

namespace trainer {
namespace fs = std::filesystem;
namespace {

std::string read_image_bytes(const SourceImage& image) {
  if (image.archive) {
    std::string bytes(image.size, '\0');
    USER_CHECK(image.archive->read_at(image.offset, bytes.data(), image.size) == image.size, "'",
               image.path, "' ends inside ", image.filename, ": an incomplete download?");
    return bytes;
  }
  std::ifstream in(image.path, std::ios::binary);
  USER_CHECK(in, "cannot read '", image.path, "'");
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

// Pixel boxes to [0, 1], clipped to the image, corners in order (as process_bounding_boxes.py).
std::vector<std::array<float, 4>> normalised_boxes(const SourceImage& image, ImageSize size) {
  std::vector<std::array<float, 4>> out;
  for (const auto& b : image.boxes) {
    const float w = static_cast<float>(size.width), h = static_cast<float>(size.height);
    const float x0 = std::clamp(b[0] / w, 0.f, 1.f), x1 = std::clamp(b[2] / w, 0.f, 1.f);
    const float y0 = std::clamp(b[1] / h, 0.f, 1.f), y1 = std::clamp(b[3] / h, 0.f, 1.f);
    out.push_back({std::min(x0, x1), std::min(y0, y1), std::max(x0, x1), std::max(y0, y1)});
  }
  return out;
}

}  // namespace

std::string source_image_example(const SourceImage& image) {
  ImageExample e;
  e.encoded = read_image_bytes(image);
  std::string error;
  ImageSize size;
  USER_CHECK(encoded_image_size(e.encoded, &size, &error, ImageFormats::kImageFolder), "'",
             image.path, image.archive ? "' member '" + image.filename + "'" : "'",
             " is not a decodable image: ", error);
  const bool jpeg =
      e.encoded.size() > 2 && uint8_t(e.encoded[0]) == 0xFF && uint8_t(e.encoded[1]) == 0xD8;
  if (!jpeg || is_cmyk_jpeg(e.encoded)) {  // the standard format holds RGB JPEGs only
    cv::Mat rgb, bgr;
    USER_CHECK(decode_full(e.encoded, &rgb, &error, ImageFormats::kImageFolder), "'", image.path,
               "' ", image.filename, ": ", error);
    cv::cvtColor(rgb, bgr, cv::COLOR_RGB2BGR);
    std::vector<uint8_t> out;
    cv::imencode(".jpg", bgr, out, {cv::IMWRITE_JPEG_QUALITY, 100});
    e.encoded.assign(out.begin(), out.end());
  }
  e.label = image.label;
  e.height = size.height;
  e.width = size.width;
  e.filename = image.filename;
  e.synset = image.synset;
  e.text = image.text.empty() ? image.synset : image.text;
  e.format = "JPEG";
  e.boxes = normalised_boxes(image, size);
  return serialize_image_example(e);
}

namespace {

std::string shard_name(const ShardOptions& o, int shard) {
  char name[64];
  std::snprintf(name, sizeof(name), "%s-%05d-of-%05d", o.prefix.c_str(), shard, o.shards);
  return name;
}

// The records of a shard a previous run finished (its index present and ending where the data
// ends), or -1 when it must be written.
int64_t finished_shard_records(const fs::path& path) {
  std::error_code error;
  const auto index_path = fs::path(path.string() + ".idx");
  if (!fs::is_regular_file(path, error) || !fs::is_regular_file(index_path, error)) return -1;
  try {
    const auto entries = read_index_file(index_path.string());
    const auto size = static_cast<int64_t>(fs::file_size(path));
    const int64_t end = entries.empty() ? 0 : entries.back().offset + entries.back().size;
    if (end != size) return -1;  // more shards than images leaves some empty, and finished
    return static_cast<int64_t>(entries.size());
  } catch (const UserError&) {
    return -1;  // a damaged index: write the shard again
  }
}

// Written under a hidden name (no data glob such as train-* takes it for data), index first,
// then renamed: a shard's name appears only with its whole content.
int64_t write_shard(const std::vector<SourceImage>& images, size_t begin, size_t end,
                    const fs::path& path, std::atomic<int64_t>& done) {
  const fs::path partial = path.parent_path() / ("." + path.filename().string() + ".partial");
  RecordWriter writer(partial.string());
  for (size_t i = begin; i < end; ++i) {
    writer.write(source_image_example(images[i]));
    ++done;
  }
  writer.close();
  USER_CHECK(write_index_file(path.string() + ".idx", writer.index()), "cannot write '",
             path.string(), ".idx'");
  fs::rename(partial, path);
  return static_cast<int64_t>(end - begin);
}

std::string duration_text(double seconds) {
  const auto s = static_cast<int64_t>(seconds);
  char text[32];
  if (s >= 3600)
    std::snprintf(text, sizeof(text), "%ldh%02ldm", long(s / 3600), long(s / 60 % 60));
  else
    std::snprintf(text, sizeof(text), "%ldm%02lds", long(s / 60), long(s % 60));
  return text;
}

void report_progress(const ShardOptions& o, int64_t done, int64_t total, double seconds) {
  const double rate = seconds > 0 ? done / seconds : 0;
  std::fprintf(stderr, "%s: %ld/%ld images (%.1f%%) | %.0f img/s | %s left\n", o.prefix.c_str(),
               long(done), long(total), total ? 100.0 * done / total : 100.0, rate,
               rate > 0 ? duration_text((total - done) / rate).c_str() : "?");
}

}  // namespace

ShardSummary write_shards(std::vector<SourceImage> images, const std::string& out_dir,
                          const ShardOptions& o) {
  USER_CHECK(o.shards > 0 && o.threads > 0, "shards and threads must be > 0");
  USER_CHECK(!images.empty(), "no images to write as ", o.prefix, " shards");
  std::mt19937_64 rng(o.seed);
  std::shuffle(images.begin(), images.end(), rng);  // every shard holds every class
  fs::create_directories(out_dir);
  ShardSummary summary;
  std::vector<int> unfinished;
  for (int s = 0; s < o.shards; ++s) {
    summary.paths.push_back((fs::path(out_dir) / shard_name(o, s)).string());
    const int64_t records = finished_shard_records(summary.paths.back());
    if (records < 0) unfinished.push_back(s);
    summary.images += std::max<int64_t>(records, 0);
  }
  summary.kept = o.shards - static_cast<int>(unfinished.size());
  int64_t to_write = 0;
  for (int s : unfinished)
    to_write += (images.size() * (s + 1) / o.shards) - images.size() * s / o.shards;

  std::atomic<size_t> next{0};
  std::atomic<int64_t> done{0}, written{0};
  std::atomic<int> running{o.threads};
  std::atomic<bool> failed{false};  // the other writers stop at their next shard
  std::mutex error_mutex;
  std::exception_ptr error;
  auto work = [&] {
    try {
      for (size_t t = next++; t < unfinished.size() && !failed; t = next++) {
        const size_t s = unfinished[t];
        written += write_shard(images, images.size() * s / o.shards,
                               images.size() * (s + 1) / o.shards, summary.paths[s], done);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      failed = true;
    }
    --running;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < o.threads; ++t) threads.emplace_back(work);
  const auto start = std::chrono::steady_clock::now();
  auto last = start;
  while (running > 0) {  // progress until the writers end (each ends at its error or last shard)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const auto now = std::chrono::steady_clock::now();
    if (o.progress_seconds > 0 && now - last >= std::chrono::duration<double>(o.progress_seconds)) {
      report_progress(o, done, to_write, std::chrono::duration<double>(now - start).count());
      last = now;
    }
  }
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
  summary.images += written;
  return summary;
}

}  // namespace trainer
