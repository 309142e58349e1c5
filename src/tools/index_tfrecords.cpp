// index-tfrecords: writes DALI-format index files (`offset size` per record) for TFRecord files,
// beside them or into --out-dir (named as the trainer's index cache names them), and, where the
// records carry image/class/synset, the class names file synsets.txt beside them.
#include <filesystem>
#include <iostream>
#include <map>
#include <vector>

#include "data/datasets/class_names.h"
#include "data/datasets/record_classes.h"
#include "data/formats/tfrecord/file.h"
#include "data/formats/tfrecord/image_example.h"
#include "data/formats/tfrecord/index.h"
#include "data/formats/tfrecord/record.h"
#include "src/tools/tool_main.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

// The classes the records of `file` name. A record that does not parse as TensorFlow's layout
// (TFDS's names no synsets) adds nothing: the classes are a by-product of indexing.
RecordClasses classes_of_file(const std::string& file, const std::vector<IndexEntry>& entries) {
  RecordClasses classes;
  ReadFile in(file);
  std::vector<uint8_t> buffer;
  ImageExample example;
  std::string error;
  for (const IndexEntry& e : entries) {
    buffer.resize(static_cast<size_t>(e.size));
    if (in.read_at(e.offset, buffer.data(), e.size) != e.size) continue;
    std::string_view payload;
    int64_t size = 0;
    if (parse_record(buffer.data(), e.size, &payload, &size) != RecordStatus::kOk ||
        !parse_image_example(payload, &example, &error))
      continue;
    classes.add(example.label, example.synset, example.text,
                file + " at byte " + std::to_string(e.offset));
  }
  return classes;
}

// The index of the first class where `kept` and `found` differ; -1 when they agree.
int64_t first_difference(const std::vector<ClassName>& kept, const std::vector<ClassName>& found) {
  for (size_t i = 0; i < std::max(kept.size(), found.size()); ++i)
    if (i >= kept.size() || i >= found.size() || kept[i].synset != found[i].synset)
      return static_cast<int64_t>(i);
  return -1;
}

// Writes `folder`/synsets.txt from the records' classes; a file already there is kept when it
// lists the same synsets in the same order (it may have richer words), and is an error otherwise.
void write_synsets(const fs::path& folder, const RecordClasses& classes) {
  if (classes.empty()) return;  // the records carry no image/class/synset
  const fs::path path = folder / kClassNamesFile;
  std::string gap;
  const std::vector<ClassName> found = classes.ordered(&gap);
  if (!gap.empty()) {
    std::cerr << "warning: no record in " << folder.string() << " has label " << gap
              << ", between the lowest and the highest: no " << kClassNamesFile
              << " written (its lines would shift onto the wrong classes). Fix: write it by hand\n";
    return;
  }
  if (fs::exists(path)) {
    const int64_t at = first_difference(read_class_names(path.string()), found);
    USER_CHECK(at < 0, path.string(), " differs from the classes the records name, first at ",
               "line ", at + 1, " (class ", at, "). Fix: delete it to have it written from the ",
               "records, or correct the records");
    std::cout << path.string() << ": kept, the records name its " << found.size() << " classes\n";
    return;
  }
  try {
    write_class_names(path.string(), found);
  } catch (const std::exception& e) {  // a read-only data folder: the indexes went to --out-dir
    std::cerr << "warning: cannot write " << path.string() << " (" << e.what()
              << "): training on this data has no class names. Fix: run index-tfrecords once "
              << "where the folder is writable, or write the file elsewhere and set the "
              << "trainer's class_names_file to it\n";
    return;
  }
  std::cout << path.string() << ": " << found.size() << " classes, line 1 = stored label "
            << classes.lowest_label() << "\n";
}

}  // namespace
}  // namespace trainer

int main(int argc, char** argv) {
  CLI::App app{
      "Writes <file>.idx index files for TFRecord files, and synsets.txt beside them when the "
      "records carry image/class/synset: one class per line, 'WNID words', ordered by stored "
      "label, line 1 being the lowest label (class 0 once the trainer's label_offset is "
      "subtracted)",
      "index-tfrecords"};
  std::vector<std::string> inputs;
  std::string out_dir;
  app.add_option("inputs", inputs, "TFRecord files, globs or folders")->required();
  app.add_option("--out-dir", out_dir,
                 "write indexes here (the trainer's index_cache_dir) instead of beside the data");
  return trainer::run_tool(app, argc, argv, [&] {
    int damaged = 0;
    std::map<std::filesystem::path, trainer::RecordClasses> classes;  // by data folder
    for (const auto& input : inputs) {
      for (const auto& file : trainer::list_tfrecord_files(input, "inputs")) {
        trainer::ScanResult scan = trainer::scan_tfrecord_file(file, /*check_payload_crc=*/false);
        for (const auto& b : scan.bad) {
          std::cerr << "DAMAGED " << file << " at byte " << b.offset << ": " << b.reason << "\n";
          ++damaged;
        }
        const std::string path =
            out_dir.empty() ? file + ".idx" : trainer::cached_index_path(file, out_dir);
        USER_CHECK(trainer::write_index_file(path, scan.entries), "cannot write '", path, "'");
        std::cout << path << ": " << scan.entries.size() << " records\n";
        classes[std::filesystem::path(file).parent_path()].merge(
            trainer::classes_of_file(file, scan.entries));
      }
    }
    for (const auto& [folder, found] : classes) trainer::write_synsets(folder, found);
    return damaged ? 1 : 0;
  });
}
