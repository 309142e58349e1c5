#include "src/config/config.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <type_traits>

#include "base/user_error.h"
#include "src/config/input.h"
#include "src/config/limits.h"

namespace trainer {

namespace {

// A double as --help and config.toml show it: as iostreams print it (6 significant digits) where
// that reads back as the same value, else the shortest text that does (3.0517578125e-05, not
// 3.05176e-05), so that the resolved config.toml reproduces every value exactly.
std::string exact_text(double value) {
  std::ostringstream out;
  out << value;
  if (std::strtod(out.str().c_str(), nullptr) == value) return out.str();
  char text[32];
  return std::string(text, std::to_chars(text, text + sizeof text, value).ptr);
}

// A choice key's values: "fp32 | fp16 | bf16" for --help, "fp32, fp16, bf16" in an error.
template <typename Choice>
std::string choice_list(Choice type, const std::string& separator = " | ") {
  std::string out;
  for (const auto& choice : choice_names(type))
    out += (out.empty() ? "" : separator) + std::string(choice.name);
  return out;
}

// The value named `text` of a choice key; UserError naming the key and the valid names.
template <typename Choice>
Choice parse_choice(const std::string& key, const std::string& text, Choice type) {
  for (const auto& choice : choice_names(type))
    if (text == choice.name) return choice.value;
  throw UserError("config key '" + key + "' = '" + text +
                  "' is not allowed; use one of: " + choice_list(type, ", "));
}

// A key's help with what it may be: "training epochs (> 0)".
std::string with_rule(const std::string& help, const std::string& rule) {
  return rule.empty() ? help : help + " (" + rule + ")";
}

// A choice key is read as its name and parsed at once; its default shows as a name.
template <typename Choice>
void add_choice(CLI::App& app, const char* group, const char* key, Choice& field,
                const std::string& help) {
  CLI::Option* option = app.add_option_function<std::string>(
      std::string("--") + key,
      [key, &field](const std::string& text) { field = parse_choice(key, text, Choice{}); },
      with_rule(help, choice_list(field)));
  option->default_str(name_of(field))->type_name("TEXT")->group(group);
  option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

template <typename T>
void add_value(CLI::App& app, const char* group, const char* key, T& field,
               const std::string& help) {
  CLI::Option* option = app.add_option(std::string("--") + key, field, help);
  if constexpr (std::is_floating_point_v<T>)
    option->default_function([&field] { return exact_text(field); });
  option->capture_default_str()->group(group);
  // A key given twice (file, then command line; or twice on the command line): the last wins.
  if constexpr (!std::is_same_v<T, std::vector<int64_t>>)
    option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

template <typename T>
void add_key(CLI::App& app, const char* group, const char* key, T& field, const char* help,
             const Limits& limits) {
  if constexpr (std::is_enum_v<T>)
    add_choice(app, group, key, field, help);
  else
    add_value(app, group, key, field, with_rule(help, limits.rule()));
}

// Binds every key of `c` (src/config/keys.def) to an option whose default is its current value,
// grouped for --help.
void add_options(CLI::App& app, Config& c) {
  using namespace limits;
#define CONFIG_KEY(group, type, name, default_value, key_limits, help) \
  add_key(app, group, #name, c.name, help, key_limits);
#include "src/config/keys.def"
#undef CONFIG_KEY
}

// Edits (insert, delete, substitute) between two keys, to suggest the key a typo meant.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// Options of `train` that are not configuration keys.
bool is_command(const std::string& name) {
  return name == "help" || name == "config" || name == "help_markdown" ||
         name == "plan_world_size" || name == "plan_train_images";
}

bool is_key(const CLI::App& app, const std::string& name) {
  return !is_command(name) && app.get_option_no_throw("--" + name) != nullptr;
}

// " (did you mean 'batch_size'?)" when a key is within a few edits of `name`; else "".
// `prefix` is how the key is written where the typo was: "" in the file, "--" on the command line.
std::string did_you_mean(const CLI::App& app, const std::string& name, const std::string& prefix) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, name.size() / 4) + 1;
  for (const CLI::Option* option : app.get_options())
    for (const std::string& key : option->get_lnames()) {
      if (is_command(key)) continue;
      const size_t distance = edit_distance(name, key);
      if (distance < best_distance) best = key, best_distance = distance;
    }
  return best.empty() ? "" : " (did you mean " + prefix + best + "?)";
}

// What is wrong in the --config file at `path` that CLI11 refused: a table (the file is flat),
// or the first key no option has. CLI11's own message ("INI was not able to parse ...") names
// neither the file nor the fix.
std::string config_file_problem(const CLI::App& app, const std::string& path) {
  std::ifstream in(path);
  for (const CLI::ConfigItem& item : CLI::ConfigTOML().from_config(in)) {
    if (!item.parents.empty())
      return "config file " + path + " has a [" + item.parents.front() +
             "] table; keys go at the top level, outside any [section]";
    if (!is_key(app, item.name))
      return "config file " + path + ": '" + item.name + "' is not a key" +
             did_you_mean(app, item.name, "");
  }
  return "";
}

// The first unknown option among the command-line words CLI11 did not take.
std::string unknown_argument_problem(const CLI::App& app, const std::vector<std::string>& words) {
  for (const std::string& word : words)
    if (word.rfind("--", 0) == 0) {
      const std::string name = word.substr(2, word.find('=') - 2);
      return "unknown option --" + name + did_you_mean(app, name, "--");
    }
  const std::string& word = words.front();
  if (word.find('/') != std::string::npos)  // most likely an unquoted glob the shell expanded
    return "unexpected argument '" + word +
           "': quote a glob so the shell passes it whole, e.g. --train_data "
           "'/fsx/imagenet/train-*'";
  return "unexpected argument '" + word + "' (every setting is --key value)";
}

}  // namespace

std::optional<CommandLine> parse_command_line(int argc, const char* const argv[]) {
  CommandLine line;
  Config& config = line.config;
  CLI::App app{
      "Trains ResNet on one GPU, the CPU, or many GPUs under mpirun.\n"
      "Every key can be set in the --config file (key = value) and overridden as --key."};
  app.set_config("--config", "", "TOML file of `key = value` lines");
  app.allow_config_extras(CLI::config_extras_mode::error);
  app.allow_extras();  // unknown command-line options: reported below, with a suggestion
  add_options(app, config);
  bool markdown = false;
  app.add_flag("--help_markdown", markdown, "every key as Markdown tables (docs/configuration.md)");
  app.add_option("--plan_world_size", line.plan_world_size,
                 "print the run's plan on N ranks (batches, steps, learning rate) and exit: 0 "
                 "when it can start, 2 with the error and its fix");
  app.add_option("--plan_train_images", line.plan_train_images,
                 "the plan's training images per epoch (default: the data source's, or "
                 "ImageNet-1k's 1281167 for TFRecords)");
  const std::string hint = ". Run `train --help` for every key and its values.";
  check_config_files(argc, argv);
  try {
    app.parse(argc, argv);
    if (markdown) {
      std::cout << config_reference_markdown();
      return std::nullopt;
    }
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return std::nullopt;
  } catch (const CLI::ConfigError& e) {
    const CLI::Option* file = app["--config"];
    const std::string problem =
        file->count() > 0 ? config_file_problem(app, file->as<std::string>()) : "";
    throw UserError((problem.empty() ? std::string(e.what()) : problem) + hint);
  } catch (const CLI::ParseError& e) {
    throw UserError(std::string(e.what()) + hint);
  }
  if (!app.remaining().empty())
    throw UserError(unknown_argument_problem(app, app.remaining()) + hint);
  check_text_values(app);
  return line;
}

// TOML value of one option from its default string (the resolved value, see config_to_toml).
std::string toml_value(const CLI::Option& option) {
  const std::string value = option.get_default_str();
  const std::string type = option.get_type_name();
  if (option.get_items_expected_max() > 1) {  // a list: "30 60 80" -> [30, 60, 80]
    std::istringstream items(value);
    std::string item, out;
    while (items >> item) out += (out.empty() ? "" : ", ") + item;
    return "[" + out + "]";
  }
  if (type == "BOOLEAN") return value == "1" || value == "true" ? "true" : "false";
  if (type == "TEXT") return "\"" + value + "\"";  // nothing to escape: check_text_values
  return value;
}

std::string config_to_toml(const Config& config) {
  Config copy = config;
  CLI::App app;
  add_options(app, copy);  // each option's default string is the resolved value
  std::string out, group;
  for (const CLI::Option* option : app.get_options()) {
    if (option->get_name() == "--help") continue;
    if (option->get_group() != group) {
      group = option->get_group();
      out += (out.empty() ? "# " : "\n# ") + group + "\n";
    }
    out += option->get_name().substr(2) + " = " + toml_value(*option) + "\n";
  }
  return out;
}

std::string config_reference_markdown() {
  Config defaults;
  CLI::App app;
  add_options(app, defaults);
  auto cell = [](std::string text) {  // a table cell: its own | would end it
    for (size_t at = text.find('|'); at != text.npos; at = text.find('|', at + 2))
      text.insert(at, "\\");
    return text;
  };
  std::string out, group;
  for (const CLI::Option* option : app.get_options()) {
    if (option->get_name() == "--help") continue;
    if (option->get_group() != group) {
      group = option->get_group();
      out += (out.empty() ? "### " : "\n### ") + group +
             "\n\n| key | default | what |\n| --- | --- | --- |\n";
    }
    out += "| `" + option->get_name().substr(2) + "` | `" + toml_value(*option) + "` | " +
           cell(option->get_description()) + " |\n";
  }
  return out;
}

}  // namespace trainer
