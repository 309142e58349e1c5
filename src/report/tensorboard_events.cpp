#include "src/report/tensorboard_events.h"

#include <chrono>

#include "src/tensorboard.pb.h"  // generated into the build folder of src/

namespace trainer {
namespace tb = resnet_trainer::tensorboard;
namespace {

constexpr int kDtString = 7;  // TensorFlow's DataType DT_STRING
constexpr int kRgb = 3;       // Summary.Image colorspace

tb::Event event_at(int64_t step) {
  tb::Event event;
  event.set_wall_time(
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  event.set_step(step);
  return event;
}

tb::Summary::Value* value_of(tb::Event& event, const std::string& tag) {
  tb::Summary::Value* value = event.mutable_summary()->add_value();
  value->set_tag(tag);
  return value;
}

}  // namespace

std::string file_version_event() {
  tb::Event event = event_at(0);
  event.set_file_version("brain.Event:2");
  return event.SerializeAsString();
}

std::string session_start_event(int64_t step) {
  tb::Event event = event_at(step);
  event.mutable_session_log()->set_status(tb::SessionLog::START);
  return event.SerializeAsString();
}

std::string scalar_event(const std::string& tag, int64_t step, double value) {
  tb::Event event = event_at(step);
  value_of(event, tag)->set_simple_value(static_cast<float>(value));
  return event.SerializeAsString();
}

std::string image_event(const std::string& tag, int64_t step, const std::string& png, int height,
                        int width) {
  tb::Event event = event_at(step);
  tb::Summary::Image* image = value_of(event, tag)->mutable_image();
  image->set_height(height);
  image->set_width(width);
  image->set_colorspace(kRgb);
  image->set_encoded_image_string(png);
  return event.SerializeAsString();
}

std::string text_event(const std::string& tag, int64_t step, const std::string& markdown) {
  tb::Event event = event_at(step);
  tb::Summary::Value* value = value_of(event, tag);
  value->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  tb::TensorProto* tensor = value->mutable_tensor();
  tensor->set_dtype(kDtString);
  tensor->mutable_tensor_shape();  // a scalar: no dimensions
  tensor->add_string_val(markdown);
  return event.SerializeAsString();
}

}  // namespace trainer
