// The ImageNet `tf.train.Example` in its two layouts, TensorFlow's (tensorflow/models inception
// build_imagenet_data.py) and TensorFlow Datasets' (imagenet2012): which layout a record has,
// parsing the features the trainer needs out of a record payload, and building a complete example
// with every standard feature of TensorFlow's layout for the converter and the dataset generator.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace trainer {
namespace tf {
class ReusableExample;
}

// Which features of an Example hold the image and the label.
enum class RecordLayout {
  kAuto,        // not known yet: detected from a record (detect_record_layout)
  kTensorflow,  // image/encoded, image/class/label (1..1000), image/height, image/filename, ...
  kTfds,        // image, label (0..999), file_name
};

// The names of an Example's image (bytes) and label (int64) features.
struct FeatureKeys {
  std::string_view image;
  std::string_view label;
};

// Of a known layout (not kAuto).
FeatureKeys feature_keys(RecordLayout layout);
// The stored label of class 0: TensorFlow's converter writes 1..1000 (0 is its "background"
// class), TFDS writes 0..999.
int64_t default_label_offset(RecordLayout layout);
// The layout's name as the record_layout key and the tools' --record-layout take it ("tfds").
const char* layout_name(RecordLayout layout);
// The layout named `name` (auto, tensorflow, tfds); false when it names none.
bool layout_from_name(std::string_view name, RecordLayout* layout);

// The layout whose image (bytes) and label (int64) features `payload` holds: kTensorflow when it
// holds TensorFlow's, else kTfds when TFDS's, else kAuto. `features` gets what the record holds,
// for the error that names them: "file_name (bytes), image (bytes), label (int64)".
RecordLayout detect_record_layout(std::string_view payload, std::string* features);

struct ImageExample {
  std::string encoded;          // image/encoded: JPEG (PNG tolerated) bytes
  int64_t label = 0;            // image/class/label as stored (1..1000 in ImageNet)
  int64_t height = 0;           // image/height (0 when absent)
  int64_t width = 0;            // image/width (0 when absent)
  std::string filename;         // image/filename
  std::string synset;           // image/class/synset
  std::string text;             // image/class/text
  std::string format = "JPEG";  // image/format
  // image/object/bbox/{xmin,ymin,xmax,ymax}: boxes normalised to [0, 1], each labelled `label`.
  std::vector<std::array<float, 4>> boxes;
};

// Parses `payload` as a record of `layout` (not kAuto); returns false and sets `error` when it is
// not an Example or lacks the layout's image or label. TFDS records fill encoded, label and
// filename only.
bool parse_image_example(std::string_view payload, ImageExample* out, std::string* error,
                         RecordLayout layout = RecordLayout::kTensorflow);

// Parses the two features training needs, named by `keys`, record after record, into buffers it
// keeps: no allocation per record once warm (a fresh ~110 KB string per image costs page faults
// and heap consolidation). Same checks and messages as parse_image_example. One per thread.
class ImageFeatureParser {
 public:
  explicit ImageFeatureParser(FeatureKeys keys);
  ~ImageFeatureParser();
  // `encoded` points into this parser's buffers: valid until the next parse. `boxes`, when given,
  // receives image/object/bbox/{xmin,ymin,xmax,ymax} as {xmin, ymin, xmax, ymax} (as many as the
  // shortest of the four lists; none when the record has none), reusing its capacity.
  bool parse(std::string_view payload, std::string_view* encoded, int64_t* label,
             std::string* error, std::vector<std::array<float, 4>>* boxes = nullptr);

 private:
  FeatureKeys keys_;  // views of static names (feature_keys) or of the caller's strings
  std::unique_ptr<tf::ReusableExample> message_;
};

// The serialized Example with every standard feature (empty bounding-box lists for an image
// without boxes, as build_imagenet_data.py writes).
std::string serialize_image_example(const ImageExample& example);

}  // namespace trainer
