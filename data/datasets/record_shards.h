// Images to sharded TFRecords in the standard ImageNet layout (build_imagenet_data.py's
// Example: image/encoded, image/class/label 1-based, synset, text, size, bounding boxes), each
// shard with its DALI index file, written in parallel and resumably: a shard appears complete or
// not at all, and a rerun keeps the complete ones and writes the rest.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace trainer {

class ReadFile;

// One image to convert: a file, or a byte range of an archive (a tar read in place).
struct SourceImage {
  std::string path;                         // the file, or the archive holding the image
  std::shared_ptr<const ReadFile> archive;  // when set, the image is [offset, offset + size) of it
  int64_t offset = 0;
  int64_t size = 0;
  std::string filename;  // image/filename, e.g. n01440764_10026.JPEG
  int64_t label = 0;     // image/class/label: 1-based index of the class in sorted WNID order
  std::string synset;    // image/class/synset, e.g. n01440764
  std::string text;      // image/class/text, e.g. "tench, Tinca tinca"
  // Bounding boxes in pixels (xmin, ymin, xmax, ymax), stored normalised to [0, 1].
  std::vector<std::array<float, 4>> boxes;
};

// The serialized Example of one image. PNGs and CMYK JPEGs (a few ImageNet files) are re-encoded
// as RGB JPEG, as build_imagenet_data.py does; the rest is stored byte for byte. UserError naming
// the image when it cannot be read or decoded.
std::string source_image_example(const SourceImage& image);

struct ShardOptions {
  std::string prefix = "train";  // shard names: <prefix>-NNNNN-of-MMMMM
  int shards = 16;
  int threads = 2;
  uint64_t seed = 12345;  // images are shuffled across shards (as build_imagenet_data.py does)
  double progress_seconds = 30;  // a progress line (images, rate, ETA) this often; 0: none
};

struct ShardSummary {
  std::vector<std::string> paths;  // every shard, in order
  int64_t images = 0;              // records in all shards, finished earlier ones included
  int kept = 0;                    // shards a previous run had finished, left as they were
};

// Writes `images` as `options.shards` shards into `out_dir`.
ShardSummary write_shards(std::vector<SourceImage> images, const std::string& out_dir,
                          const ShardOptions& options);

}  // namespace trainer
