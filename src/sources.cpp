#include "src/sources.h"

#include <algorithm>
#include <thread>

#include "data/formats/tfrecord/file.h"
#include "data/formats/tfrecord/index.h"
#include "data/sources/memory_source.h"
#include "data/sources/synthetic_source.h"
#include "data/sources/tfrecord_source.h"

namespace trainer {

// Data: TFRecord input pipeline. One source per split; the files are listed (and a missing
// folder or empty glob reported, naming the key) before training starts.
namespace {

std::unique_ptr<BatchSource> make_tfrecord_source(const Config& config, c10::Device device,
                                                  int rank, int local_size, const std::string& key,
                                                  const std::string& pattern, bool training) {
  TFRecordSourceOptions o;
  o.files = list_tfrecord_files(pattern, key);
  o.training = training;
  // Training in micro-batches (Note [Fixed global batch]); evaluation in batches of batch_size.
  o.batch_size = training ? config.micro_batch_size() : config.batch_size;
  o.seed = config.seed;
  o.rank = rank;
  o.world_size = config.world_size;
  o.num_classes = config.num_classes;
  o.record_layout = config.record_layout;  // auto: each split's own first record decides
  o.label_offset = config.label_offset;    // -1: the layout's
  // FixRes: the evaluation crop may differ from the training crop (val_image_size).
  o.transform.image_size =
      static_cast<int>(training ? config.image_size : config.eval_image_size());
  o.transform.val_resize = static_cast<int>(config.val_resize);
  if (training) o.image_sizes = progressive_image_sizes(config);
  o.transform.train_crop = config.train_crop;  // training only: evaluation takes the centre
  // Training only: transform_image never augments evaluation crops.
  o.transform.policy.policy = config.auto_augment;
  o.transform.policy.randaugment_num_ops = static_cast<int>(config.randaugment_num_ops);
  o.transform.policy.randaugment_magnitude = static_cast<int>(config.randaugment_magnitude);
  o.transform.policy.interpolation = config.augment_interpolation;
  o.transform.policy.random_erasing = config.random_erasing;
  o.pin_memory = device.is_cuda();
  o.reader_threads = static_cast<int>(config.reader_threads);
  // Default: this node's cores shared evenly among its ranks.
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  o.decode_threads = config.decode_threads > 0 ? static_cast<int>(config.decode_threads)
                                               : std::max(1, cores / local_size);
  o.prefetch_batches = config.prefetch_batches;
  o.shuffle_buffer = config.shuffle_buffer;
  o.epoch_order = config.epoch_order;
  o.repetitions = config.repeated_augmentation;
  o.whole_steps_of = config.whole_steps_of();
  o.index_cache_dir = config.index_cache_dir;
  o.fail_on_bad_record = config.bad_record_policy == BadRecordPolicy::kFail;
  o.max_bad_fraction = config.max_bad_fraction;
  // A batch later than a collective may be would stall the other ranks past their watchdog anyway.
  o.wait_timeout = std::chrono::seconds(config.collective_timeout_s);
  return std::make_unique<TFRecordSource>(std::move(o));
}

}  // namespace

std::optional<ImageSizeSchedule> progressive_image_sizes(const Config& config) {
  if (!config.progressive_resize()) return std::nullopt;
  return ImageSizeSchedule{config.progressive_resize_min_size, config.progressive_resize_max_size,
                           config.progressive_resize_start_epoch,
                           config.progressive_resize_end_epoch, config.progressive_resize_step};
}

int64_t train_image_size(const Config& config, int64_t epoch) {
  const auto sizes = progressive_image_sizes(config);
  return sizes ? sizes->at(epoch) : config.image_size;
}

void build_tfrecord_indexes(const Config& config, int local_rank, int local_size) {
  if (config.data_source != DataSource::kTfrecord) return;
  for (const auto& [key, pattern] :
       {std::pair{"train_data", config.train_data}, std::pair{"val_data", config.val_data}}) {
    if (pattern.empty() || (config.evaluate_only && key == std::string("train_data"))) continue;
    build_missing_indexes(list_tfrecord_files(pattern, key), config.index_cache_dir, local_rank,
                          local_size, static_cast<int>(config.reader_threads));
  }
}

Sources make_sources(const Config& config, c10::Device device, int rank, int local_size) {
  Sources sources;
  if (config.data_source == DataSource::kSynthetic) {
    SyntheticOptions options{config.micro_batch_size(),
                             config.image_size,
                             config.num_classes,
                             config.synthetic_batches_per_epoch,
                             config.seed,
                             rank,
                             config.world_size,
                             progressive_image_sizes(config),
                             config.whole_steps_of()};
    sources.train = std::make_unique<SyntheticSource>(options, device);
    return sources;
  }
  if (config.data_source == DataSource::kTfrecord) {
    if (!config.evaluate_only)
      sources.train =
          make_tfrecord_source(config, device, rank, local_size, "train_data", config.train_data,
                               /*training=*/true);
    if (!config.val_data.empty())
      sources.val =
          make_tfrecord_source(config, device, rank, local_size, "val_data", config.val_data,
                               /*training=*/false);
    return sources;
  }
  // generated: a training split and a held-out split of the same classes, drawn with other seeds.
  // The training images at the run's largest size (resized down for smaller epochs), the
  // held-out ones at the evaluation crop.
  const auto sizes = progressive_image_sizes(config);
  GeneratedDatasetOptions data{config.generated_classes, config.generated_train_images,
                               sizes ? sizes->largest() : config.image_size, config.seed};
  MemorySourceOptions train{config.micro_batch_size(),
                            /*training=*/true,         config.seed, device.is_cuda(),       rank,
                            config.world_size,         sizes,       config.whole_steps_of()};
  if (!config.evaluate_only)
    sources.train = std::make_unique<MemorySource>(generate_labelled_images(data), train);
  data.images = config.generated_val_images;
  data.image_size = config.eval_image_size();
  data.seed = config.seed + 1;
  MemorySourceOptions val{
      config.batch_size, /*training=*/false, config.seed, device.is_cuda(), rank,
      config.world_size};
  sources.val = std::make_unique<MemorySource>(generate_labelled_images(data), val);
  return sources;
}

}  // namespace trainer
