// The config file parser (CLI11's TOML reader and our keys, choices and values) and the rules
// between values: any file is read or refused with a UserError naming the problem, and a config
// that passes validation prints as TOML that reads back as the same config.
#include <sstream>

#include "base/user_error.h"
#include "src/config/config.h"
#include "tests/fuzz/fuzz_input.h"

namespace trainer::fuzz {
namespace {

std::optional<CommandLine> parse_file(const std::string& path) {
  const char* argv[] = {"train", "--config", path.c_str()};
  try {
    return parse_command_line(3, argv);
  } catch (const UserError&) {  // CLI11's own errors too: they must not escape unexplained
  }
  return std::nullopt;
}

// The first line where `a` and `b` differ, as "'line of a' became 'line of b'".
std::string first_difference(const std::string& a, const std::string& b) {
  std::istringstream in_a(a), in_b(b);
  std::string line_a, line_b;
  while (std::getline(in_a, line_a) && std::getline(in_b, line_b))
    if (line_a != line_b) return "'" + line_a + "' became '" + line_b + "'";
  return "one has more lines";
}

}  // namespace
}  // namespace trainer::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainer;
  const std::string path =
      fuzz::write_input_file({reinterpret_cast<const char*>(data), size}, ".toml");
  const auto parsed = fuzz::parse_file(path);
  if (!parsed) return 0;
  try {
    validate_config(parsed->config);
  } catch (const UserError&) {
    return 0;
  }
  const std::string toml = config_to_toml(parsed->config);
  const auto again = fuzz::parse_file(fuzz::write_input_file(toml, ".toml"));
  FUZZ_EXPECT(again, "the resolved config is refused:\n" + toml);
  const std::string toml_again = config_to_toml(again->config);
  FUZZ_EXPECT(toml_again == toml, "the resolved config does not read back as itself: " +
                                      fuzz::first_difference(toml, toml_again));
  return 0;
}
