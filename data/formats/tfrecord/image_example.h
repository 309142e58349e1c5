// The ImageNet `tf.train.Example` (tensorflow/models inception build_imagenet_data.py): parsing
// the features the trainer needs out of a record payload, and building a complete example with
// every standard feature for the converter and the dataset generator.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace trainer {
namespace tf {
class ReusableExample;
}

struct ImageExample {
  std::string encoded;          // image/encoded: JPEG (PNG tolerated) bytes
  int64_t label = 0;            // image/class/label as stored (1..1000 in ImageNet)
  int64_t height = 0;           // image/height (0 when absent)
  int64_t width = 0;            // image/width (0 when absent)
  std::string filename;         // image/filename
  std::string synset;           // image/class/synset
  std::string text;             // image/class/text
  std::string format = "JPEG";  // image/format
};

// Parses `payload`; returns false and sets `error` when it is not an Example or lacks
// image/encoded or image/class/label.
bool parse_image_example(std::string_view payload, ImageExample* out, std::string* error);

// Parses the two features training needs, record after record, into buffers it keeps: no
// allocation per record once warm (a fresh ~110 KB string per image costs page faults and heap
// consolidation). Same checks and messages as parse_image_example. One per thread.
class ImageFeatureParser {
 public:
  ImageFeatureParser();
  ~ImageFeatureParser();
  // `encoded` points into this parser's buffers: valid until the next parse.
  bool parse(std::string_view payload, std::string_view* encoded, int64_t* label,
             std::string* error);

 private:
  std::unique_ptr<tf::ReusableExample> message_;
};

// The serialized Example with every standard feature (empty bounding-box lists, as the
// converter writes for images without boxes).
std::string serialize_image_example(const ImageExample& example);

}  // namespace trainer
