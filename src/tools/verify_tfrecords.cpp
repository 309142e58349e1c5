// verify-tfrecords: checks every record of a dataset (CRCs, Example, image decode and size,
// label range), prints a report with per-class counts, and exits 1 when anything is damaged.
// Reads either record layout (TensorFlow's or TFDS's), detected from the first record as `train`
// detects it.
#include <iostream>
#include <thread>

#include "data/formats/tfrecord/file.h"
#include "data/formats/tfrecord/verify.h"
#include "src/tools/tool_main.h"

int main(int argc, char** argv) {
  CLI::App app{"Verifies TFRecord files; exit status 1 when any record is damaged",
               "verify-tfrecords"};
  std::vector<std::string> inputs;
  trainer::VerifyOptions o;
  o.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bool no_decode = false;
  std::string layout = "auto";
  app.add_option("inputs", inputs, "TFRecord files, globs or folders")->required();
  app.add_option("--num-classes", o.num_classes, "classes")->capture_default_str();
  app.add_option("--record-layout", layout, "auto (from the first record) | tensorflow | tfds")
      ->capture_default_str();
  app.add_option("--label-offset", o.label_offset,
                 "lowest valid stored label; -1: the layout's (tensorflow 1, tfds 0)")
      ->capture_default_str();
  app.add_flag("--no-decode", no_decode, "skip decoding the images");
  app.add_option("--threads", o.threads, "files verified in parallel")->capture_default_str();
  app.add_option("--dump", o.dump_path, "write one TSV line per record here");
  return trainer::run_tool(app, argc, argv, [&] {
    o.decode = !no_decode;
    USER_CHECK(trainer::layout_from_name(layout, &o.layout), "--record-layout ", layout,
               " is not a layout. Fix: use auto, tensorflow or tfds");
    std::vector<std::string> files;
    for (const auto& input : inputs)
      for (auto& f : trainer::list_tfrecord_files(input, "inputs")) files.push_back(f);
    const trainer::VerifyReport report = trainer::verify_tfrecord_files(files, o);
    std::cout << trainer::format_report(report);
    std::cout << (report.ok() ? "OK\n" : "DAMAGED\n");
    return report.ok() ? 0 : 1;
  });
}
