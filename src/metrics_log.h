// A JSON-lines metrics file for machines: one object per event (train interval, evaluation,
// benchmark), flushed as written so a crash loses nothing already logged.
#pragma once

#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace trainer {

class MetricsLog {
 public:
  using Value = std::variant<int64_t, double, std::string>;
  using Fields = std::vector<std::pair<std::string, Value>>;

  // Appends to `path` (a resumed run continues the same file); an empty path logs nothing.
  explicit MetricsLog(const std::filesystem::path& path);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // Writes {"event": event, "time": <unix seconds>, fields...}.
  void write(const std::string& event, const Fields& fields);

 private:
  std::FILE* file_ = nullptr;
};

// JSON string literal with quotes and escapes.
std::string json_quote(const std::string& text);

}  // namespace trainer
