// make-tfrecords: converts an ImageFolder tree (root/<class>/<image>) into sharded TFRecords in
// the standard ImageNet format, with DALI index files, in parallel.
#include <iostream>
#include <thread>

#include "data/datasets/image_folder.h"
#include "src/tools/tool_main.h"

int main(int argc, char** argv) {
  CLI::App app{"Converts root/<class>/<image> into ImageNet-format TFRecord shards + .idx files",
               "make-tfrecords"};
  std::string root, out_dir;
  trainer::ConvertOptions o;
  o.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  app.add_option("root", root, "ImageFolder root")->required();
  app.add_option("out_dir", out_dir, "output folder")->required();
  app.add_option("--prefix", o.prefix, "shard name prefix (train, validation)")
      ->capture_default_str();
  app.add_option("--shards", o.shards, "number of shards")->capture_default_str();
  app.add_option("--threads", o.threads, "parallel shard writers")->capture_default_str();
  app.add_option("--seed", o.seed, "shuffle of images across shards")->capture_default_str();
  return trainer::run_tool(app, argc, argv, [&] {
    const auto paths = trainer::convert_image_folder(root, out_dir, o);
    std::cout << "wrote " << paths.size() << " shards to " << out_dir << "\n";
    return 0;
  });
}
