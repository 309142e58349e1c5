// The tf.train.Example parsers, TensorFlow's layout and TFDS's: parse_image_example (the
// converter's and verifier's), the reusable ImageFeatureParser (training's, kept across records
// as in training), and layout detection. Whatever one parser accepts the other reads alike, and
// an accepted example survives serialising and parsing again.
#include <string>

#include "data/formats/tfrecord/image_example.h"
#include "tests/fuzz/fuzz_input.h"

namespace trainer::fuzz {
namespace {

void check_layout(std::string_view payload, RecordLayout layout) {
  ImageExample example;
  std::string error;
  const bool parsed = parse_image_example(payload, &example, &error, layout);
  static ImageFeatureParser tensorflow(feature_keys(RecordLayout::kTensorflow));
  static ImageFeatureParser tfds(feature_keys(RecordLayout::kTfds));
  ImageFeatureParser& parser = layout == RecordLayout::kTfds ? tfds : tensorflow;
  std::string_view encoded;
  int64_t label = -1;
  std::vector<std::array<float, 4>> boxes;
  std::string parser_error;
  const bool fast = parser.parse(payload, &encoded, &label, &parser_error, &boxes);
  FUZZ_EXPECT(parsed == fast,
              "parse_image_example: '" + error + "'; parser: '" + parser_error + "'");
  if (!parsed) {
    FUZZ_EXPECT(!error.empty() && error == parser_error, error + " | " + parser_error);
    return;
  }
  FUZZ_EXPECT(encoded == example.encoded && label == example.label, "parsers disagree");
  if (layout != RecordLayout::kTensorflow) return;
  ImageExample again;
  FUZZ_EXPECT(parse_image_example(serialize_image_example(example), &again, &error),
              "serialised example unreadable: " + error);
  FUZZ_EXPECT(again.encoded == example.encoded, "encoded");
  FUZZ_EXPECT(again.label == example.label && again.height == example.height &&
                  again.width == example.width,
              "label, height or width");
  FUZZ_EXPECT(again.filename == example.filename && again.synset == example.synset &&
                  again.text == example.text,
              "filename, synset or text");
  // An example without image/format is written as JPEG, what the converters write.
  FUZZ_EXPECT(again.format == (example.format.empty() ? "JPEG" : example.format), again.format);
}

}  // namespace
}  // namespace trainer::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainer;
  const std::string_view payload(reinterpret_cast<const char*>(data), size);
  std::string features;
  detect_record_layout(payload, &features);
  fuzz::check_layout(payload, RecordLayout::kTensorflow);
  fuzz::check_layout(payload, RecordLayout::kTfds);
  return 0;
}
