// The Example parser: a round trip through the project's writer, the reusable parser the
// training input runs record after record, and each record layout (TensorFlow's, TFDS's) detected
// from one record or named in the error.
#include <gtest/gtest.h>

#include <string>

#include "base/user_error.h"
#include "data/formats/tfrecord/image_example.h"
#include "data/formats/tfrecord/record_layout.h"
#include "tests/support/tfrecord_test_util.h"

namespace trainer {
namespace {

TEST(Example, RoundTripAndMissingFeatures) {
  ImageExample in;
  in.encoded = std::string("\xff\xd8\xff jpeg bytes \0 with nul", 26);
  in.label = 417;
  in.height = 375;
  in.width = 500;
  in.filename = "n01440764_10026.JPEG";
  in.synset = "n01440764";
  ImageExample out;
  std::string error;
  ASSERT_TRUE(parse_image_example(serialize_image_example(in), &out, &error)) << error;
  EXPECT_EQ(out.encoded, in.encoded);
  EXPECT_EQ(out.label, 417);
  EXPECT_EQ(out.height, 375);
  EXPECT_EQ(out.width, 500);
  EXPECT_EQ(out.filename, in.filename);
  EXPECT_EQ(out.synset, in.synset);
  EXPECT_EQ(out.format, "JPEG");
  EXPECT_FALSE(parse_image_example("\x0a\x05garbage", &out, &error));
  EXPECT_FALSE(parse_image_example("", &out, &error));  // an empty Example: no features
  EXPECT_EQ(error, "missing feature image/encoded");
}

namespace wire = testing::wire;  // Examples written field by field

// The training input's parser reuses its buffers record after record: each parse must see only
// its own record, and judge damage as parse_image_example does.
TEST(Example, ReusableParserAgreesWithTheFullParse) {
  ImageExample big, small;
  big.encoded = std::string(5000, '\x11');
  big.label = 3;
  small.encoded = "\xff\xd8\xff small";
  small.label = 1000;
  ImageExample out;
  ImageFeatureParser parser(feature_keys(RecordLayout::kTensorflow));
  std::string_view encoded;
  int64_t label = 0;
  std::string error;
  for (const ImageExample* e : {&big, &small, &big, &small}) {
    ASSERT_TRUE(parser.parse(serialize_image_example(*e), &encoded, &label, &error)) << error;
    EXPECT_EQ(encoded, e->encoded);
    EXPECT_EQ(label, e->label);
  }
  // Features in another order, a key given twice (a map keeps the last; concatenated messages
  // merge) and a feature of the wrong kind, written as protobuf's wire format.
  const std::string reordered = wire::example({{"image/class/label", wire::int64_feature(9)},
                                               {"image/encoded", wire::bytes_feature("pixels")}});
  const std::string twice =
      reordered + wire::example({{"image/class/label", wire::int64_feature(10)}});
  ASSERT_TRUE(parser.parse(twice, &encoded, &label, &error)) << error;
  ASSERT_TRUE(parse_image_example(twice, &out, &error));
  EXPECT_EQ(encoded, "pixels");
  EXPECT_EQ(label, 10);
  EXPECT_EQ(out.label, 10);
  const std::string wrong_kind = wire::example({{"image/class/label", wire::bytes_feature("9")},
                                                {"image/encoded", wire::bytes_feature("pixels")}});
  for (const std::string& bad : {std::string("\x0a\x05garbage"), std::string(), wrong_kind}) {
    std::string full_error;
    EXPECT_FALSE(parser.parse(bad, &encoded, &label, &error));
    EXPECT_FALSE(parse_image_example(bad, &out, &full_error));
    EXPECT_EQ(error, full_error);
  }
}

// Asked for them, the parser reads a record's boxes as {xmin, ymin, xmax, ymax}, none from a
// record without, and each parse only its own record's.
TEST(Example, ReusableParserReadsTheBoxes) {
  ImageExample two, none;
  two.encoded = none.encoded = "\xff\xd8\xff pixels";
  two.label = none.label = 5;
  two.boxes = {{0.1f, 0.2f, 0.6f, 0.7f}, {0.0f, 0.5f, 1.0f, 0.75f}};
  ImageFeatureParser parser(feature_keys(RecordLayout::kTensorflow));
  std::string_view encoded;
  int64_t label = 0;
  std::string error;
  std::vector<std::array<float, 4>> boxes = {{9, 9, 9, 9}};
  for (const ImageExample* e : {&two, &none, &two}) {
    ASSERT_TRUE(parser.parse(serialize_image_example(*e), &encoded, &label, &error, &boxes))
        << error;
    EXPECT_EQ(boxes, e->boxes);
    EXPECT_EQ(encoded, e->encoded);
  }
  // Not asked: left as they were.
  ASSERT_TRUE(parser.parse(serialize_image_example(none), &encoded, &label, &error));
  EXPECT_EQ(boxes, two.boxes);
}

// Each layout is told from one record by its two features and their kinds, whatever else the
// record holds; a record of neither names what it holds, for the error a user reads.
TEST(Example, DetectsEachLayoutFromOneRecord) {
  ImageExample tensorflow;
  tensorflow.encoded = "\xff\xd8\xff jpeg";
  tensorflow.label = 5;
  std::string features;
  EXPECT_EQ(detect_record_layout(serialize_image_example(tensorflow), &features),
            RecordLayout::kTensorflow);
  EXPECT_NE(features.find("image/encoded (bytes)"), std::string::npos) << features;
  EXPECT_EQ(
      detect_record_layout(testing::tfds_example("\xff\xd8\xff jpeg", 0, "a.JPEG"), &features),
      RecordLayout::kTfds);
  EXPECT_EQ(features, "file_name (bytes), image (bytes), label (int64)");
  const std::string unknown = wire::example({{"pixels", wire::bytes_feature("jpeg")},
                                             {"class", wire::int64_feature(3)},
                                             {"label", wire::bytes_feature("3")}});
  EXPECT_EQ(detect_record_layout(unknown, &features), RecordLayout::kAuto);
  // Sorted by name, each with its kind: the label here is text, so TFDS's names alone don't match.
  EXPECT_EQ(features, "class (int64), label (bytes), pixels (bytes)");
  EXPECT_EQ(detect_record_layout("\x0a\x05garbage", &features), RecordLayout::kAuto);
  EXPECT_EQ(features, "none: the record is not a tf.train.Example");
  EXPECT_EQ(default_label_offset(RecordLayout::kTensorflow), 1);  // 1..1000 -> 0..999
  EXPECT_EQ(default_label_offset(RecordLayout::kTfds), 0);        // 0..999 kept
}

// TFDS's keys read by both parsers; a record of the other layout lacks the keys asked for.
TEST(Example, ParsersReadTfdsKeys) {
  const std::string tfds = testing::tfds_example("\xff\xd8\xff tfds", 999, "n0144_1.JPEG");
  ImageFeatureParser parser(feature_keys(RecordLayout::kTfds));
  std::string_view encoded;
  int64_t label = -1;
  std::string error;
  ASSERT_TRUE(parser.parse(tfds, &encoded, &label, &error)) << error;
  EXPECT_EQ(encoded, "\xff\xd8\xff tfds");
  EXPECT_EQ(label, 999);
  ImageExample out;
  ASSERT_TRUE(parse_image_example(tfds, &out, &error, RecordLayout::kTfds)) << error;
  EXPECT_EQ(out.encoded, "\xff\xd8\xff tfds");
  EXPECT_EQ(out.label, 999);
  EXPECT_EQ(out.filename, "n0144_1.JPEG");
  EXPECT_EQ(out.height, 0);  // TFDS stores no size
  ImageExample tensorflow;
  tensorflow.encoded = "jpeg";
  EXPECT_FALSE(parser.parse(serialize_image_example(tensorflow), &encoded, &label, &error));
  EXPECT_EQ(error, "missing feature image");
  ImageFeatureParser tf_parser(feature_keys(RecordLayout::kTensorflow));
  EXPECT_FALSE(tf_parser.parse(tfds, &encoded, &label, &error));
  EXPECT_EQ(error, "missing feature image/encoded");
  EXPECT_FALSE(parse_image_example(tfds, &out, &error));
  EXPECT_EQ(error, "missing feature image/encoded");
}

}  // namespace
}  // namespace trainer
