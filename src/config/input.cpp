#include "src/config/input.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "base/user_error.h"

namespace trainer {
namespace {

// The largest --config file read: a config is a few dozen `key = value` lines (~2 KB).
constexpr int64_t kMaxConfigBytes = int64_t(1) << 20;

// What of `value` CLI11 would not keep, for the errors below; "" when it keeps all of it.
const char* unkept(const std::string& value) {
  if (std::any_of(value.begin(), value.end(),
                  [](char c) { return uint8_t(c) < 0x20 || c == 0x7f; }))
    return "a control character";
  if (value.find('"') != std::string::npos) return "a double quote";
  if (!value.empty() && value.back() == '\\') return "a backslash at its end";
  if (value.find('#') != std::string::npos) return "'#', which CLI11 takes for a comment";
  if (value.find(',') != std::string::npos) return "',', which CLI11 takes for a list's separator";
  return "";
}

// The quoted values of the config file at `path`: none may hold '#' or ','.
void check_quoted_values(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;  // blank or a comment
    const size_t equals = line.find('=');
    const size_t open = line.find_first_of("\"'", equals == std::string::npos ? 0 : equals);
    if (equals == std::string::npos || open == std::string::npos ||
        line.find_first_not_of(" \t", equals + 1) != open)
      continue;  // not `key = "value"`: CLI11 reports what it cannot read
    const size_t close = line.find(line[open], open + 1);
    const std::string value =
        line.substr(open + 1, close == std::string::npos ? std::string::npos : close - open - 1);
    const size_t bad = value.find_first_of("#,");
    USER_CHECK(bad == std::string::npos, "config file ", path, " line ", number, ": the value of '",
               line.substr(0, line.find_first_of(" \t=")), "' holds '", value[bad],
               "', which CLI11's reader takes for ", value[bad] == '#' ? "a comment" : "a list",
               " even inside quotes. Fix: give the value without it");
  }
}

}  // namespace

void check_config_files(int argc, const char* const argv[]) {
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    std::string path;
    if (word == "--config" && i + 1 < argc) path = argv[i + 1];
    if (word.rfind("--config=", 0) == 0) path = word.substr(std::strlen("--config="));
    if (path.empty()) continue;
    std::error_code error;
    const auto size = std::filesystem::file_size(path, error);
    if (error) continue;  // CLI11 names the file it cannot read
    USER_CHECK(size <= static_cast<uintmax_t>(kMaxConfigBytes), "config file ", path, " is ", size,
               " bytes, over the limit of ", kMaxConfigBytes,
               " (a config is a few dozen `key = value` lines). Fix: give the path of a config");
    check_quoted_values(path);
  }
}

void check_text_values(const CLI::App& app) {
  for (const CLI::Option* option : app.get_options()) {
    if (option->get_type_name() != "TEXT" || option->count() == 0) continue;
    for (const std::string& value : option->results()) {
      const std::string problem = unkept(value);
      USER_CHECK(problem.empty(), "config key '", option->get_name().substr(2), "' = '", value,
                 "' holds ", problem,
                 ", which config.toml could not hold. Fix: give the value without it");
    }
  }
}

}  // namespace trainer
