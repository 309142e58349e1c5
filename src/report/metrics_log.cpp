#include "src/report/metrics_log.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>

#include "base/user_error.h"

namespace trainer {

std::string json_quote(const std::string& text) {
  std::string out = "\"";
  for (unsigned char ch : text) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += static_cast<char>(ch);
    } else if (ch < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", ch);
      out += escaped;
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out + "\"";
}

MetricsLog::MetricsLog(const std::filesystem::path& path, const std::string& tensorboard_dir) {
  if (!tensorboard_dir.empty()) tensorboard_ = std::make_unique<TensorBoardWriter>(tensorboard_dir);
  if (path.empty()) return;
  file_ = std::fopen(path.c_str(), "a");
  USER_CHECK(file_ != nullptr, "cannot open metrics file ", path, ": ", std::strerror(errno),
             ". Fix: make output_dir writable");
}

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

void MetricsLog::write(const std::string& event, const Fields& fields) {
  if (tensorboard_) mirror(event, fields);
  if (!file_) return;
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::string line = "{\"event\": " + json_quote(event) + ", \"time\": " + std::to_string(now);
  for (const auto& [key, value] : fields) {
    line += ", " + json_quote(key) + ": ";
    if (auto* i = std::get_if<int64_t>(&value)) {
      line += std::to_string(*i);
    } else if (auto* d = std::get_if<double>(&value)) {
      char number[32];
      std::snprintf(number, sizeof(number), "%.9g", *d);
      line += std::isfinite(*d) ? number : "null";  // JSON has no inf/NaN
    } else {
      line += json_quote(std::get<std::string>(value));
    }
  }
  line += "}\n";
  std::fputs(line.c_str(), file_);
  std::fflush(file_);
}

void MetricsLog::mirror(const std::string& event, const Fields& fields) {
  int64_t step = 0;
  std::string tag = event;
  for (const auto& [key, value] : fields) {
    if (key == "step") step = std::get<int64_t>(value);
    if (key == "rank" && std::holds_alternative<int64_t>(value))  // a rank's own curves
      tag = event + "_" + std::to_string(std::get<int64_t>(value));
  }
  for (const auto& [key, value] : fields) {
    if (key == "step" || (tag != event && key == "rank")) continue;
    if (auto* i = std::get_if<int64_t>(&value))
      tensorboard_->scalar(tag + "/" + key, step, static_cast<double>(*i));
    else if (auto* d = std::get_if<double>(&value))
      tensorboard_->scalar(tag + "/" + key, step, *d);
  }
}

void MetricsLog::flush() {
  if (tensorboard_) tensorboard_->flush();
}

}  // namespace trainer
