// bench-input: the input pipeline alone (no model) on given TFRecord files: images/s in total and
// per decode thread, for the training and evaluation transforms, to size threads per GPU; the
// training transform with each augmentation policy and random-erasing probability asked for.
// With --epochs: whole training epochs of one rank instead, each with the bytes it had read from
// storage, to see what a node's page cache serves under each epoch_order.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

#include "data/formats/tfrecord/file.h"
#include "data/formats/tfrecord/record_layout.h"
#include "data/sources/tfrecord_source.h"
#include "src/report/process_stats.h"
#include "src/tools/tool_main.h"

using namespace std::string_literals;

namespace {

// CPU seconds (user + system) used by every thread of this process so far.
double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

struct Rate {
  double per_second = 0;      // wall clock
  double per_cpu_second = 0;  // all threads' CPU time: readers, decoders and the consumer
};

// Throughput of `source` over at least `images` images, after `warmup` images. The warm-up
// covers the shuffle buffer and the prefetch window, so that the figure is the steady state of a
// long epoch (every recycled buffer in place), not the start of one.
Rate measure(trainer::TFRecordSource& source, int64_t images, int64_t warmup) {
  int64_t epoch = 0, done = 0;
  source.start_epoch(epoch);
  auto next = [&] {
    if (source.batches_left() == 0) source.start_epoch(++epoch);
    return source.next_batch().images.size(0);
  };
  for (int64_t warm = 0; warm < std::max<int64_t>(warmup, 1);) warm += next();
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = cpu_seconds();
  while (done < images) done += next();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double cpu = cpu_seconds() - cpu_start;
  return {static_cast<double>(done) / seconds, static_cast<double>(done) / cpu};
}

// Checks one augmentation setting and measures the pipeline with it; prints one row.
void run_row(trainer::TFRecordSourceOptions run, const std::string& mode, const std::string& policy,
             double erasing, int threads, int64_t images, int64_t warmup) {
  trainer::AugmentPolicyOptions& augment = run.transform.policy;
  USER_CHECK(trainer::policy_from_name(policy, &augment.policy), "--auto-augment ", policy,
             " is not a policy. Fix: use none, trivialaugment_wide, randaugment or "
             "autoaugment_imagenet");
  USER_CHECK(erasing >= 0 && erasing <= 1, "--random-erasing ", erasing,
             " is not a probability. Fix: give values in [0, 1]");
  USER_CHECK(augment.randaugment_num_ops >= 1 && augment.randaugment_magnitude >= 0 &&
                 augment.randaugment_magnitude <= 30,
             "--randaugment-num-ops ", augment.randaugment_num_ops, " --randaugment-magnitude ",
             augment.randaugment_magnitude, ". Fix: at least one op, a magnitude bin in [0, 30]");
  augment.random_erasing = erasing;
  run.decode_threads = threads;
  char label[64];
  std::snprintf(label, sizeof label, erasing > 0 ? "%s + erasing %.2f" : "%s", policy.c_str(),
                erasing);
  trainer::TFRecordSource source(run);
  const Rate rate = measure(source, images, warmup);
  std::printf("%-6s %8d %-36s %12.1f %18.1f %16.1f\n", mode.c_str(), threads,
              mode == "train" ? label : "-", rate.per_second, rate.per_second / threads,
              rate.per_cpu_second);
  std::fflush(stdout);
}

// Whole training epochs of rank o.rank of o.world_size: one row each, timed from the epoch's
// start (the first from the source's construction, which starts it) to its last batch.
void run_epochs(trainer::TFRecordSourceOptions o, int epochs, int threads) {
  o.training = true;
  o.decode_threads = threads;
  std::printf("%-6s %8s %10s %12s %22s %12s\n", "epoch", "images", "seconds", "images/s",
              "MB read from storage", "KB/image");
  int64_t read_before = trainer::bytes_read_from_storage();
  auto start = std::chrono::steady_clock::now();
  trainer::TFRecordSource source(o);
  for (int epoch = 0; epoch < epochs; ++epoch) {
    if (epoch > 0) {
      read_before = trainer::bytes_read_from_storage();
      start = std::chrono::steady_clock::now();
      source.start_epoch(epoch);
    }
    int64_t images = 0;
    while (source.batches_left() > 0) images += source.next_batch().images.size(0);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double read = static_cast<double>(trainer::bytes_read_from_storage() - read_before);
    std::printf("%-6d %8lld %10.2f %12.1f %22.1f %12.1f\n", epoch + 1,
                static_cast<long long>(images), seconds, static_cast<double>(images) / seconds,
                read / 1e6, images ? read / 1e3 / static_cast<double>(images) : 0.0);
    std::fflush(stdout);
  }
}

// The files `inputs` name, their layout (the one `layout` names, or for auto their first
// record's, detected once here as train detects it rather than by each measurement's source)
// and its label base unless --label-offset gave one; printed above the table.
void set_files(const std::vector<std::string>& inputs, const std::string& layout,
               trainer::TFRecordSourceOptions* o) {
  for (const auto& input : inputs)
    for (auto& f : trainer::list_tfrecord_files(input, "inputs")) o->files.push_back(f);
  USER_CHECK(trainer::layout_from_name(layout, &o->record_layout), "--record-layout ", layout,
             " is not a layout. Fix: use auto, tensorflow or tfds");
  o->record_layout = trainer::resolve_record_layout(o->record_layout, o->files, "--record-layout");
  if (o->label_offset < 0) o->label_offset = trainer::default_label_offset(o->record_layout);
  std::printf("%s layout, stored labels from %lld\n", trainer::layout_name(o->record_layout),
              static_cast<long long>(o->label_offset));
}

// What bench-input is asked to measure.
struct Args {
  std::vector<std::string> inputs, transforms = {"train", "val"};
  std::vector<int> threads = {1, 2};
  std::vector<std::string> policies = {"none"};  // the config's auto_augment values
  std::vector<double> erasing = {0.0};           // the config's random_erasing
  trainer::TFRecordSourceOptions o;
  int64_t images = 2000, warmup = 1500;
  std::string layout = "auto", order = "global";
  int epochs = 0;
};

void add_options(CLI::App& app, Args& a) {
  trainer::TFRecordSourceOptions& o = a.o;
  o.batch_size = 64;
  o.num_classes = 1000;
  app.add_option("inputs", a.inputs, "TFRecord files, globs or folders")->required();
  app.add_option("--threads", a.threads, "decode thread counts to try")->capture_default_str();
  app.add_option("--transforms", a.transforms, "train and/or val")->capture_default_str();
  app.add_option("--images", a.images, "images timed per measurement")->capture_default_str();
  app.add_option("--warmup-images", a.warmup, "images decoded before timing")
      ->capture_default_str();
  app.add_option("--shuffle-buffer", o.shuffle_buffer, "shuffle buffer, records")
      ->capture_default_str();
  app.add_option("--batch-size", o.batch_size, "batch size")->capture_default_str();
  app.add_option("--image-size", o.transform.image_size, "crop size")->capture_default_str();
  app.add_option("--val-resize", o.transform.val_resize, "eval shorter side")
      ->capture_default_str();
  app.add_option("--reader-threads", o.reader_threads, "reader threads")->capture_default_str();
  app.add_option("--auto-augment", a.policies,
                 "train: policies to try (none, trivialaugment_wide, randaugment, "
                 "autoaugment_imagenet)")
      ->capture_default_str();
  app.add_option("--randaugment-num-ops", o.transform.policy.randaugment_num_ops,
                 "randaugment: ops per image")
      ->capture_default_str();
  app.add_option("--randaugment-magnitude", o.transform.policy.randaugment_magnitude,
                 "randaugment: magnitude bin of 31")
      ->capture_default_str();
  app.add_option("--random-erasing", a.erasing, "train: random-erasing probabilities to try")
      ->capture_default_str();
  app.add_option("--num-classes", o.num_classes, "classes")->capture_default_str();
  app.add_option("--record-layout", a.layout, "auto (from the first record) | tensorflow | tfds")
      ->capture_default_str();
  app.add_option("--label-offset", o.label_offset,
                 "stored label of class 0; -1: the layout's (tensorflow 1, tfds 0)")
      ->capture_default_str();
  app.add_option("--index-cache-dir", o.index_cache_dir, "index cache")->capture_default_str();
  app.add_option("--epochs", a.epochs,
                 "instead of the table: this many whole training epochs of --rank, each with "
                 "the bytes read from storage (first --threads value)")
      ->capture_default_str();
  app.add_option("--rank", o.rank, "--epochs: the rank measured")->capture_default_str();
  app.add_option("--world-size", o.world_size, "--epochs: ranks in the job")->capture_default_str();
  app.add_option("--epoch-order", a.order, "--epochs: global | by_node")->capture_default_str();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Measures the TFRecord input pipeline alone (reading, decoding, augmenting)",
               "bench-input"};
  Args a;
  add_options(app, a);
  return trainer::run_tool(app, argc, argv, [&] {
    trainer::TFRecordSourceOptions& o = a.o;
    set_files(a.inputs, a.layout, &o);
    if (a.epochs > 0) {
      USER_CHECK(a.order == "global" || a.order == "by_node", "--epoch-order ", a.order,
                 " is not an a.order. Fix: use global or by_node");
      USER_CHECK(o.world_size >= 1 && o.rank >= 0 && o.rank < o.world_size, "--rank ", o.rank,
                 " of --world-size ", o.world_size, ". Fix: a rank in [0, world size)");
      o.epoch_order =
          a.order == "by_node" ? trainer::EpochOrder::kByNode : trainer::EpochOrder::kGlobal;
      run_epochs(o, a.epochs, a.threads.front());
      return 0;
    }
    std::printf("%-6s %8s %-36s %12s %18s %16s\n", "mode", "threads", "augmentation", "images/s",
                "images/s/thread", "images/cpu-s");
    for (const auto& mode : a.transforms) {
      USER_CHECK(mode == "train" || mode == "val", "--transforms takes train and/or val");
      o.training = mode == "train";
      // Evaluation never augments: one measurement per thread count.
      for (const auto& policy : o.training ? a.policies : std::vector{"none"s})
        for (double p : o.training ? a.erasing : std::vector{0.0})
          for (int t : a.threads) run_row(o, mode, policy, p, t, a.images, a.warmup);
    }
    return 0;
  });
}
