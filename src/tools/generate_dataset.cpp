// generate-dataset: a small labelled JPEG dataset (ImageNet-like sizes and encoding, learnable
// classes) as an ImageFolder tree and/or ImageNet-format TFRecord shards (train and validation).
#include <iostream>

#include "data/datasets/jpeg_dataset.h"
#include "src/tools/tool_main.h"

int main(int argc, char** argv) {
  CLI::App app{"Generates a labelled JPEG dataset for smoke runs, tests and benchmarks",
               "generate-dataset"};
  trainer::JpegDatasetOptions o;
  std::string folder, tfrecords;
  int train_shards = 4, val_shards = 2, val_per_class = 0;
  app.add_option("--classes", o.classes, "classes")->capture_default_str();
  app.add_option("--images-per-class", o.images_per_class, "training images per class")
      ->capture_default_str();
  app.add_option("--val-per-class", val_per_class, "validation images per class (TFRecords)")
      ->capture_default_str();
  app.add_option("--width", o.width, "image width (a quarter are portrait)")->capture_default_str();
  app.add_option("--height", o.height, "image height")->capture_default_str();
  app.add_option("--quality", o.quality, "JPEG quality (4:2:0)")->capture_default_str();
  app.add_option("--seed", o.seed, "seed")->capture_default_str();
  app.add_option("--image-folder", folder, "write an ImageFolder tree here");
  app.add_option("--tfrecords", tfrecords, "write train-*/validation-* TFRecords here");
  app.add_option("--train-shards", train_shards, "training shards")->capture_default_str();
  app.add_option("--val-shards", val_shards, "validation shards")->capture_default_str();
  return trainer::run_tool(app, argc, argv, [&] {
    USER_CHECK(!folder.empty() || !tfrecords.empty(), "give --image-folder and/or --tfrecords");
    USER_CHECK(o.classes > 0 && o.images_per_class > 0 && o.width >= 8 && o.height >= 8,
               "classes, images per class must be > 0 and sizes >= 8");
    if (!folder.empty())
      std::cout << "wrote " << trainer::write_jpeg_folder(folder, o) << " images to " << folder
                << "\n";
    if (!tfrecords.empty()) {
      trainer::write_jpeg_tfrecords(tfrecords, "train", train_shards, o);
      if (val_per_class > 0) {
        trainer::JpegDatasetOptions val = o;
        val.images_per_class = val_per_class;
        val.seed = o.seed + 1;  // held-out images of the same classes
        trainer::write_jpeg_tfrecords(tfrecords, "validation", val_shards, val);
      }
      std::cout << "wrote TFRecords to " << tfrecords << "\n";
    }
    return 0;
  });
}
