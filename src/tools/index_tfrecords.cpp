// index-tfrecords: writes DALI-format index files (`offset size` per record) for TFRecord files,
// beside them or into --out-dir (named as the trainer's index cache names them).
#include <iostream>

#include "data/formats/tfrecord/file.h"
#include "data/formats/tfrecord/index.h"
#include "src/tools/tool_main.h"

int main(int argc, char** argv) {
  CLI::App app{"Writes <file>.idx index files for TFRecord files", "index-tfrecords"};
  std::vector<std::string> inputs;
  std::string out_dir;
  app.add_option("inputs", inputs, "TFRecord files, globs or folders")->required();
  app.add_option("--out-dir", out_dir,
                 "write indexes here (the trainer's index_cache_dir) instead of beside the data");
  return trainer::run_tool(app, argc, argv, [&] {
    int damaged = 0;
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
      }
    }
    return damaged ? 1 : 0;
  });
}
