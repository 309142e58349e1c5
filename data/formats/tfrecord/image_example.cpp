#include "data/formats/tfrecord/image_example.h"

#include "data/example.pb.h"  // generated into the build folder of data/

namespace trainer {
namespace {

const tf::Feature* find(const tf::Example& example, const char* key) {
  const auto& map = example.features().feature();
  auto it = map.find(key);
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

}  // namespace

bool parse_image_example(std::string_view payload, ImageExample* out, std::string* error) {
  tf::Example example;
  if (!example.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    *error = "payload is not a tf.train.Example";
    return false;
  }
  const tf::Feature* encoded = find(example, "image/encoded");
  if (!encoded || !encoded->has_bytes_list() || encoded->bytes_list().value_size() == 0) {
    *error = "missing feature image/encoded";
    return false;
  }
  const tf::Feature* label = find(example, "image/class/label");
  if (!label || !label->has_int64_list() || label->int64_list().value_size() == 0) {
    *error = "missing feature image/class/label";
    return false;
  }
  // The image is most of the payload: move it out rather than copy it.
  out->encoded = std::move(*(*example.mutable_features()->mutable_feature())["image/encoded"]
                                .mutable_bytes_list()
                                ->mutable_value(0));
  out->label = label->int64_list().value(0);
  out->height = int64_or(example, "image/height", 0);
  out->width = int64_or(example, "image/width", 0);
  out->filename = bytes_or(example, "image/filename");
  out->synset = bytes_or(example, "image/class/synset");
  out->text = bytes_or(example, "image/class/text");
  out->format = bytes_or(example, "image/format");
  return true;
}

ImageFeatureParser::ImageFeatureParser() : message_(std::make_unique<tf::ReusableExample>()) {}

ImageFeatureParser::~ImageFeatureParser() = default;

bool ImageFeatureParser::parse(std::string_view payload, std::string_view* encoded, int64_t* label,
                               std::string* error) {
  if (!message_->ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    *error = "payload is not a tf.train.Example";
    return false;
  }
  const tf::BytesList* image = nullptr;
  const tf::Int64List* labels = nullptr;
  for (const auto& entry : message_->features().feature()) {  // a map keeps a key's last entry
    if (entry.key() == "image/encoded") image = &entry.value().bytes_list();
    if (entry.key() == "image/class/label") labels = &entry.value().int64_list();
  }
  if (!image || image->value_size() == 0) {
    *error = "missing feature image/encoded";
    return false;
  }
  if (!labels || labels->value_size() == 0) {
    *error = "missing feature image/class/label";
    return false;
  }
  *encoded = image->value(0);
  *label = labels->value(0);
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
  for (const char* key : {"image/object/bbox/xmin", "image/object/bbox/xmax",
                          "image/object/bbox/ymin", "image/object/bbox/ymax"})
    map[key].mutable_float_list();
  map["image/object/bbox/label"].mutable_int64_list();
  set_bytes(example, "image/format", e.format.empty() ? "JPEG" : e.format);
  set_bytes(example, "image/filename", e.filename);
  set_bytes(example, "image/encoded", e.encoded);
  std::string out;
  example.SerializeToString(&out);
  return out;
}

}  // namespace trainer
