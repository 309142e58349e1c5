#include "data/formats/tfrecord/image_example.h"

#include <algorithm>
#include <string_view>
#include <vector>

#include "data/example.pb.h"  // generated into the build folder of data/

namespace trainer {
namespace {

const tf::Feature* find(const tf::Example& example, std::string_view key) {
  const auto& map = example.features().feature();
  auto it = map.find(std::string(key));
  return it == map.end() ? nullptr : &it->second;
}

int64_t int64_or(const tf::Example& example, const char* key, int64_t fallback) {
  const tf::Feature* f = find(example, key);
  return f && f->has_int64_list() && f->int64_list().value_size() > 0 ? f->int64_list().value(0)
                                                                      : fallback;
}

std::string bytes_or(const tf::Example& example, const char* key) {
  const tf::Feature* f = find(example, key);
  return f && f->has_bytes_list() && f->bytes_list().value_size() > 0 ? f->bytes_list().value(0)
                                                                      : std::string();
}

void set_int64(tf::Example& example, const char* key, int64_t value) {
  (*example.mutable_features()->mutable_feature())[key].mutable_int64_list()->add_value(value);
}

void set_bytes(tf::Example& example, const char* key, const std::string& value) {
  (*example.mutable_features()->mutable_feature())[key].mutable_bytes_list()->add_value(value);
}

// What a feature holds, as the layout error names it.
const char* kind_name(const tf::Feature& feature) {
  if (feature.has_bytes_list()) return "bytes";
  if (feature.has_int64_list()) return "int64";
  if (feature.has_float_list()) return "float";
  return "empty";
}

// "name (kind), ..." of every feature of `example`, sorted by name (a map's order is arbitrary).
std::string feature_list(const tf::Example& example) {
  std::vector<std::string> found;
  for (const auto& [key, feature] : example.features().feature())
    found.push_back(key + " (" + kind_name(feature) + ")");
  std::sort(found.begin(), found.end());
  std::string out;
  for (const auto& f : found) out += (out.empty() ? "" : ", ") + f;
  return out.empty() ? "none" : out;
}

// The features of a record beyond the image and the label, by layout.
void read_tensorflow_extras(const tf::Example& example, ImageExample* out) {
  out->height = int64_or(example, "image/height", 0);
  out->width = int64_or(example, "image/width", 0);
  out->filename = bytes_or(example, "image/filename");
  out->synset = bytes_or(example, "image/class/synset");
  out->text = bytes_or(example, "image/class/text");
  out->format = bytes_or(example, "image/format");
}

void read_tfds_extras(const tf::Example& example, ImageExample* out) {
  // TFDS's imagenet2012 holds no size, synset, text or format: left unknown (0, "").
  out->height = out->width = 0;
  out->filename = bytes_or(example, "file_name");
  out->synset.clear();
  out->text.clear();
  out->format.clear();
}

}  // namespace

FeatureKeys feature_keys(RecordLayout layout) {
  if (layout == RecordLayout::kTfds) return {"image", "label"};
  return {"image/encoded", "image/class/label"};
}

int64_t default_label_offset(RecordLayout layout) { return layout == RecordLayout::kTfds ? 0 : 1; }

const char* layout_name(RecordLayout layout) {
  switch (layout) {
    case RecordLayout::kTensorflow:
      return "tensorflow";
    case RecordLayout::kTfds:
      return "tfds";
    case RecordLayout::kAuto:
      break;
  }
  return "auto";
}

bool layout_from_name(std::string_view name, RecordLayout* layout) {
  for (RecordLayout l : {RecordLayout::kAuto, RecordLayout::kTensorflow, RecordLayout::kTfds})
    if (name == layout_name(l)) {
      *layout = l;
      return true;
    }
  return false;
}

RecordLayout detect_record_layout(std::string_view payload, std::string* features) {
  tf::Example example;
  if (!example.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    *features = "none: the record is not a tf.train.Example";
    return RecordLayout::kAuto;
  }
  *features = feature_list(example);
  // Kinds checked too: a layout whose names match but whose label is text would fail each record.
  for (RecordLayout layout : {RecordLayout::kTensorflow, RecordLayout::kTfds}) {
    const FeatureKeys keys = feature_keys(layout);
    const tf::Feature* image = find(example, keys.image);
    const tf::Feature* label = find(example, keys.label);
    if (image && image->has_bytes_list() && label && label->has_int64_list()) return layout;
  }
  return RecordLayout::kAuto;
}

bool parse_image_example(std::string_view payload, ImageExample* out, std::string* error,
                         RecordLayout layout) {
  tf::Example example;
  if (!example.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    *error = "payload is not a tf.train.Example";
    return false;
  }
  const FeatureKeys keys = feature_keys(layout);
  const tf::Feature* encoded = find(example, keys.image);
  if (!encoded || !encoded->has_bytes_list() || encoded->bytes_list().value_size() == 0) {
    *error = "missing feature " + std::string(keys.image);
    return false;
  }
  const tf::Feature* label = find(example, keys.label);
  if (!label || !label->has_int64_list() || label->int64_list().value_size() == 0) {
    *error = "missing feature " + std::string(keys.label);
    return false;
  }
  // The image is most of the payload: move it out rather than copy it.
  auto& features = *example.mutable_features()->mutable_feature();
  out->encoded =
      std::move(*features[std::string(keys.image)].mutable_bytes_list()->mutable_value(0));
  out->label = label->int64_list().value(0);
  if (layout == RecordLayout::kTfds)
    read_tfds_extras(example, out);
  else
    read_tensorflow_extras(example, out);
  return true;
}

ImageFeatureParser::ImageFeatureParser(FeatureKeys keys)
    : keys_(keys), message_(std::make_unique<tf::ReusableExample>()) {}

ImageFeatureParser::~ImageFeatureParser() = default;

bool ImageFeatureParser::parse(std::string_view payload, std::string_view* encoded, int64_t* label,
                               std::string* error, std::vector<std::array<float, 4>>* boxes) {
  if (!message_->ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    *error = "payload is not a tf.train.Example";
    return false;
  }
  const tf::BytesList* image = nullptr;
  const tf::Int64List* labels = nullptr;
  // xmin, ymin, xmax, ymax: the order of ImageExample::boxes.
  static constexpr std::string_view kCorners[4] = {
      "image/object/bbox/xmin", "image/object/bbox/ymin", "image/object/bbox/xmax",
      "image/object/bbox/ymax"};
  const tf::FloatList* corners[4] = {nullptr, nullptr, nullptr, nullptr};
  for (const auto& entry : message_->features().feature()) {  // a map keeps a key's last entry
    if (entry.key() == keys_.image) image = &entry.value().bytes_list();
    if (entry.key() == keys_.label) labels = &entry.value().int64_list();
    if (boxes)
      for (int i = 0; i < 4; ++i)
        if (entry.key() == kCorners[i]) corners[i] = &entry.value().float_list();
  }
  // Messages built only on failure: a damaged record is rare, and the warm path allocates nothing.
  if (!image || image->value_size() == 0) {
    error->assign("missing feature ").append(keys_.image);
    return false;
  }
  if (!labels || labels->value_size() == 0) {
    error->assign("missing feature ").append(keys_.label);
    return false;
  }
  *encoded = image->value(0);
  *label = labels->value(0);
  if (boxes) {
    boxes->clear();
    int n = corners[0] ? corners[0]->value_size() : 0;
    for (const tf::FloatList* list : corners) n = std::min(n, list ? list->value_size() : 0);
    for (int b = 0; b < n; ++b)
      boxes->push_back(
          {corners[0]->value(b), corners[1]->value(b), corners[2]->value(b), corners[3]->value(b)});
  }
  return true;
}

std::string serialize_image_example(const ImageExample& e) {
  tf::Example example;
  set_int64(example, "image/height", e.height);
  set_int64(example, "image/width", e.width);
  set_bytes(example, "image/colorspace", "RGB");
  set_int64(example, "image/channels", 3);
  set_int64(example, "image/class/label", e.label);
  set_bytes(example, "image/class/synset", e.synset);
  set_bytes(example, "image/class/text", e.text);
  auto& map = *example.mutable_features()->mutable_feature();
  const char* corners[] = {"image/object/bbox/xmin", "image/object/bbox/ymin",
                           "image/object/bbox/xmax", "image/object/bbox/ymax"};
  for (int i = 0; i < 4; ++i) {
    auto* list = map[corners[i]].mutable_float_list();
    for (const auto& box : e.boxes) list->add_value(box[i]);
  }
  auto* box_labels = map["image/object/bbox/label"].mutable_int64_list();
  for (size_t i = 0; i < e.boxes.size(); ++i) box_labels->add_value(e.label);
  set_bytes(example, "image/format", e.format.empty() ? "JPEG" : e.format);
  set_bytes(example, "image/filename", e.filename);
  set_bytes(example, "image/encoded", e.encoded);
  std::string out;
  example.SerializeToString(&out);
  return out;
}

}  // namespace trainer
