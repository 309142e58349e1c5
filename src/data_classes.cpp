#include "src/data_classes.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <string>
#include <vector>

#include "base/storage_calls.h"
#include "base/user_error.h"
#include "data/formats/tfrecord/file.h"

namespace trainer {
namespace fs = std::filesystem;
namespace {

NamedClasses read_checked(const std::string& path, const Config& config, const char* from) {
  NamedClasses classes{read_class_names(path), path};
  USER_CHECK(static_cast<int64_t>(classes.names.size()) == config.num_classes, path, " (", from,
             ") names ", classes.names.size(), " classes but num_classes = ", config.num_classes,
             ". Fix: set num_classes to the data's class count, or class_names_file to the file ",
             "of the classes the records are labelled with");
  spdlog::info("class names: {} classes from {} ({}), e.g. class 0 = {}", classes.names.size(),
               path, from, describe_class(classes.names.front()));
  return classes;
}

// The folders holding the records the run reads: train_data's first (not read when evaluating),
// then val_data's. Listing errors are those the sources would report a moment later.
std::vector<fs::path> data_folders(const Config& config) {
  std::vector<fs::path> folders;
  if (config.data_source != DataSource::kTfrecord) return folders;
  for (const auto& [key, pattern] :
       {std::pair{"train_data", config.train_data}, std::pair{"val_data", config.val_data}}) {
    if (pattern.empty() || (config.evaluate_only && key == std::string("train_data"))) continue;
    const fs::path folder = fs::path(list_tfrecord_files(pattern, key).front()).parent_path();
    if (folders.empty() || folders.back() != folder) folders.push_back(folder);
  }
  return folders;
}

}  // namespace

NamedClasses find_data_classes(const Config& config) {
  if (!config.class_names_file.empty())
    return read_checked(config.class_names_file, config, "class_names_file");
  const std::vector<fs::path> folders = data_folders(config);
  std::string looked;
  for (const fs::path& folder : folders)
    for (const char* name : kClassNamesFiles) {
      const fs::path path = folder / name;
      const bool found = [&] {
        const StorageCallScope call("looking for", path.string());
        return fs::is_regular_file(path);
      }();
      if (found) return read_checked(path.string(), config, "beside the data");
      looked += (looked.empty() ? "" : ", ") + path.string();
    }
  spdlog::info(
      "this run has no class names ({}): checkpoints and evaluations name classes by index, and "
      "no checkpoint is checked for the data's label order. To have them: index-tfrecords writes "
      "{} beside records that carry image/class/synset, or set class_names_file (one 'WNID "
      "words' per line, class 0 first)",
      looked.empty() ? "data_source = " + std::string(name_of(config.data_source))
                     : "none of " + looked,
      kClassNamesFile);
  return {};
}

}  // namespace trainer
