// A run's outputs for machines: a JSON-lines metrics file, one object per event (train interval,
// evaluation, benchmark, start-up), flushed as written so a crash loses nothing already logged;
// and, when asked for, TensorBoard event files that mirror every numeric field of every event as
// the scalar `<event>/<field>` at the event's step (`<event>_<R>/<field>` for an event of one
// rank, which has an integer "rank" field R), plus the images and texts written to
// tensorboard().
#pragma once

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "src/report/tensorboard_writer.h"

namespace trainer {

class MetricsLog {
 public:
  using Value = std::variant<int64_t, double, std::string>;
  using Fields = std::vector<std::pair<std::string, Value>>;

  // Appends to `path` (a resumed run continues the same file); an empty path logs nothing. A
  // non-empty `tensorboard_dir` gets a new event file.
  explicit MetricsLog(const std::filesystem::path& path, const std::string& tensorboard_dir = "");
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // Writes {"event": event, "time": <unix seconds>, fields...}, and the numeric fields to
  // TensorBoard at the step the "step" field gives (0 without one).
  void write(const std::string& event, const Fields& fields);
  // Hands the buffered TensorBoard events to the file (log intervals, exit).
  void flush();
  TensorBoardWriter* tensorboard() { return tensorboard_.get(); }  // null when off

 private:
  void mirror(const std::string& event, const Fields& fields);  // numeric fields to TensorBoard

  std::FILE* file_ = nullptr;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
};

// JSON string literal with quotes and escapes.
std::string json_quote(const std::string& text);

}  // namespace trainer
