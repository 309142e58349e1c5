// bench-input: the input pipeline alone (no model) on given TFRecord files: images/s in total and
// per decode thread, for the training and evaluation transforms, to size threads per GPU.
#include <chrono>
#include <cstdio>
#include <iostream>

#include "data/tfrecord/file.h"
#include "data/tfrecord_source.h"
#include "src/tools/tool_main.h"

namespace {

// Images per second of `source` over at least `images` images, after one warm-up batch.
double measure(trainer::TFRecordSource& source, int64_t images) {
  int64_t epoch = 0, done = 0;
  source.start_epoch(epoch);
  int64_t left = source.batches_per_epoch();
  auto next = [&] {
    if (left == 0) {
      source.start_epoch(++epoch);
      left = source.batches_per_epoch();
    }
    --left;
    return source.next_batch().images.size(0);
  };
  next();  // warm-up: threads started, files opened, page cache touched
  const auto start = std::chrono::steady_clock::now();
  while (done < images) done += next();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(done) / seconds;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Measures the TFRecord input pipeline alone (reading, decoding, augmenting)",
               "bench-input"};
  std::vector<std::string> inputs, transforms = {"train", "val"};
  std::vector<int> threads = {1, 2};
  trainer::TFRecordSourceOptions o;
  int64_t images = 2000;
  o.batch_size = 64;
  o.num_classes = 1000;
  app.add_option("inputs", inputs, "TFRecord files, globs or folders")->required();
  app.add_option("--threads", threads, "decode thread counts to try")->capture_default_str();
  app.add_option("--transforms", transforms, "train and/or val")->capture_default_str();
  app.add_option("--images", images, "images timed per measurement")->capture_default_str();
  app.add_option("--batch-size", o.batch_size, "batch size")->capture_default_str();
  app.add_option("--image-size", o.transform.image_size, "crop size")->capture_default_str();
  app.add_option("--val-resize", o.transform.val_resize, "eval shorter side")
      ->capture_default_str();
  app.add_option("--reader-threads", o.reader_threads, "reader threads")->capture_default_str();
  app.add_option("--num-classes", o.num_classes, "classes")->capture_default_str();
  app.add_option("--label-offset", o.label_offset, "stored label offset")->capture_default_str();
  app.add_option("--index-cache-dir", o.index_cache_dir, "index cache")->capture_default_str();
  return trainer::run_tool(app, argc, argv, [&] {
    for (const auto& input : inputs)
      for (auto& f : trainer::list_tfrecord_files(input, "inputs")) o.files.push_back(f);
    std::printf("%-6s %8s %12s %18s\n", "mode", "threads", "images/s", "images/s/thread");
    for (const auto& mode : transforms) {
      USER_CHECK(mode == "train" || mode == "val", "--transforms takes train and/or val");
      for (int t : threads) {
        trainer::TFRecordSourceOptions run = o;
        run.training = mode == "train";
        run.decode_threads = t;
        trainer::TFRecordSource source(run);
        const double rate = measure(source, images);
        std::printf("%-6s %8d %12.1f %18.1f\n", mode.c_str(), t, rate, rate / t);
        std::fflush(stdout);
      }
    }
    return 0;
  });
}
