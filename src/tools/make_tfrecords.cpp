// make-tfrecords: converts images into sharded TFRecords in the standard ImageNet format, with
// DALI index files and the class names (synsets.txt), in parallel and resumably. From an
// ImageFolder tree (root/<class>/<image>), or from ImageNet as downloaded (--imagenet DIR: the
// image-net.org tars and devkit, or Kaggle's folders), both splits at once.
#include <filesystem>
#include <iostream>
#include <thread>

#include "data/datasets/class_names.h"
#include "data/datasets/image_folder.h"
#include "data/datasets/imagenet_download.h"
#include "src/tools/tool_main.h"

namespace {

struct Options {
  std::vector<std::string> paths;  // ROOT OUT_DIR, or OUT_DIR with --imagenet
  std::string imagenet;
  int train_shards = 1024, validation_shards = 128;
  bool allow_partial = false;
  trainer::ShardOptions shards;
};

void print_summary(const std::string& split, const trainer::ShardSummary& s, int64_t full) {
  std::cout << split << ": " << s.images << " images in " << s.paths.size() << " shards";
  if (s.kept > 0) std::cout << " (" << s.kept << " kept from an earlier run)";
  if (full > 0)
    std::cout << (s.images == full ? ", ImageNet 2012's full count" : ", fewer than ImageNet's ")
              << (s.images == full ? "" : std::to_string(full));
  std::cout << "\n";
}

// Every image listed is in the shards: shards kept from an earlier run over other images fail.
void check_written(const std::string& split, const trainer::ShardSummary& s, size_t listed,
                   const std::string& out_dir) {
  USER_CHECK(s.images == static_cast<int64_t>(listed), split, ": the shards in ", out_dir, " hold ",
             s.images, " images but ", listed, " were listed: shards kept from an ",
             "earlier run over other images or shard counts? Fix: convert into an empty folder");
}

int convert_imagenet(const Options& o, const std::string& out_dir) {
  const auto download = trainer::list_imagenet_download(o.imagenet, o.shards.threads);
  std::cout << o.imagenet << ": ImageNet from " << download.layout << ", "
            << download.classes.size() << " classes\n";
  for (const auto& split : download.splits)  // before writing anything
    USER_CHECK(o.allow_partial || static_cast<int64_t>(split.images.size()) == split.full_count,
               o.imagenet, " holds ", split.images.size(), " ", split.name, " images where ",
               "ImageNet 2012 has ", split.full_count, ": an incomplete download? Fix: download ",
               "it again, or pass --allow-partial to convert what there is");
  std::filesystem::create_directories(out_dir);
  trainer::write_class_names(out_dir + "/" + trainer::kClassNamesFile, download.classes);
  for (const auto& split : download.splits) {
    trainer::ShardOptions shards = o.shards;
    shards.prefix = split.name;
    shards.shards = split.name == "train" ? o.train_shards : o.validation_shards;
    const auto summary = trainer::write_shards(split.images, out_dir, shards);
    check_written(split.name, summary, split.images.size(), out_dir);
    print_summary(split.name, summary, split.full_count);
  }
  return 0;
}

int convert_folder(const Options& o) {
  const auto images = trainer::list_image_folder(o.paths[0]);
  std::vector<trainer::ClassName> classes;
  for (const auto& image : images)
    if (classes.empty() || classes.back().synset != image.synset)
      classes.push_back({image.synset, ""});
  std::filesystem::create_directories(o.paths[1]);
  trainer::write_class_names(o.paths[1] + "/" + trainer::kClassNamesFile, classes);
  const auto summary = trainer::write_shards(images, o.paths[1], o.shards);
  check_written(o.shards.prefix, summary, images.size(), o.paths[1]);
  print_summary(o.shards.prefix, summary, 0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Converts root/<class>/<image>, or ImageNet as downloaded (--imagenet DIR), into "
      "ImageNet-format TFRecord shards + .idx files + synsets.txt",
      "make-tfrecords"};
  Options o;
  o.shards.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  app.add_option("paths", o.paths, "ROOT OUT_DIR (an ImageFolder tree), or OUT_DIR with --imagenet")
      ->required()
      ->expected(1, 2);
  app.add_option("--imagenet", o.imagenet,
                 "folder holding ImageNet 2012 as downloaded: image-net.org's "
                 "ILSVRC2012_img_{train,val}.tar and ILSVRC2012_devkit_t12.tar.gz, or Kaggle's "
                 "LOC_synset_mapping.txt, LOC_val_solution.csv and ILSVRC/Data/CLS-LOC/");
  app.add_option("--prefix", o.shards.prefix, "shard name prefix (train, validation)")
      ->capture_default_str();
  app.add_option("--shards", o.shards.shards, "number of shards")->capture_default_str();
  app.add_option("--train-shards", o.train_shards, "--imagenet: training shards")
      ->capture_default_str();
  app.add_option("--validation-shards", o.validation_shards, "--imagenet: validation shards")
      ->capture_default_str();
  app.add_flag("--allow-partial", o.allow_partial,
               "--imagenet: convert a download with fewer images than ImageNet 2012's");
  app.add_option("--threads", o.shards.threads, "parallel shard writers")->capture_default_str();
  app.add_option("--seed", o.shards.seed, "shuffle of images across shards")->capture_default_str();
  app.add_option("--progress-seconds", o.shards.progress_seconds,
                 "seconds between progress lines (images, rate, time left); 0: none")
      ->capture_default_str();
  return trainer::run_tool(app, argc, argv, [&] {
    const bool imagenet = !o.imagenet.empty();
    USER_CHECK(o.paths.size() == (imagenet ? 1u : 2u), "expected ",
               imagenet ? "one folder, OUT_DIR, after --imagenet DIR" : "ROOT OUT_DIR", "; got ",
               o.paths.size(), " paths");
    USER_CHECK(!imagenet || (app.count("--shards") == 0 && app.count("--prefix") == 0),
               "--imagenet writes both splits, named train and validation: give their shard ",
               "counts with --train-shards and --validation-shards, not --shards or --prefix");
    return imagenet ? convert_imagenet(o, o.paths[0]) : convert_folder(o);
  });
}
