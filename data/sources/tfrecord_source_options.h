// The options of the ImageNet TFRecord source (data/sources/tfrecord_source.h), apart from it so
// that one epoch's machinery (data/sources/tfrecord_epoch.h) reads them without the source.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/formats/tfrecord/image_example.h"
#include "data/sources/epoch_plan.h"
#include "data/sources/image_size_schedule.h"
#include "data/transforms/augment.h"

namespace trainer {

struct TFRecordSourceOptions {
  std::vector<std::string> files;  // TFRecord files, e.g. from list_tfrecord_files
  bool training = true;            // shuffle, RandomResizedCrop + flip, global-batch steps
  int64_t batch_size = 256;        // per rank
  uint64_t seed = 0;               // shared by all ranks; the epoch is mixed in
  int rank = 0;
  int world_size = 1;
  int64_t num_classes = 1000;
  // Which features hold the image and the label; kAuto: detected from the first record of the
  // first file (resolve_record_layout). The source holds the resolved layout once constructed.
  RecordLayout record_layout = RecordLayout::kAuto;
  // Subtracted from stored labels (TensorFlow's ImageNet: 1..1000 -> 0..999); -1: the layout's
  // (default_label_offset: 1 for TensorFlow's, 0 for TFDS's), resolved at construction too.
  int64_t label_offset = -1;
  TransformOptions transform;  // training flag is taken from `training`
  // Training: each epoch's crop (progressive resizing) instead of transform.image_size.
  std::optional<ImageSizeSchedule> image_sizes;
  bool pin_memory = false;  // batches in pinned memory, for asynchronous copies to a GPU
  int reader_threads = 2;
  int decode_threads = 1;
  int64_t prefetch_batches = 3;   // decoded batches ready ahead of the consumer (the one default)
  int64_t shuffle_buffer = 1024;  // records (training, global order)
  // Training: one global order, or each node's records the same every epoch (Note [Records by
  // node] in data/sources/epoch_plan.h).
  EpochOrder epoch_order = EpochOrder::kGlobal;
  // Training: copies of each record an epoch shows, each on another rank with its own
  // augmentation (Note [Repeated augmentation] in data/sources/epoch_plan.h); 1: off.
  int64_t repetitions = 1;
  // Training, drop_last: each epoch ends at its last whole step of this many records (Note [The
  // last partial step] in data/sources/step_shares.h); 0: its last step takes what is left.
  int64_t whole_steps_of = 0;
  int64_t block_records = 64;       // records per read; ImageNet: ~7 MB
  std::string index_cache_dir;      // where index files go when the data folder is read-only
  bool fail_on_bad_record = false;  // false: skip (and count) bad records
  double max_bad_fraction = 0.001;  // skip: error once more than this fraction is bad
  // next_batch() waits at most this long for a batch (DeadlineExceeded), and gives up soon after
  // a stop signal (StopRequested): base/bounded_wait.h.
  std::chrono::seconds wait_timeout{300};
};

}  // namespace trainer
