// The ImageNet TFRecord BatchSource: this rank's records of each epoch (data/formats/tfrecord/
// epoch_plan.h) read in multi-MB blocks by reader threads, decoded and augmented by a pool of
// worker threads straight into the batch's (pinned) buffer, and handed out in a fixed order
// through a bounded prefetch window. Results are placed by index and each sample has its own
// seed, so the batches are the same whatever the thread counts and timing.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/formats/tfrecord/index.h"
#include "data/sources/batch_source.h"
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
  int64_t label_offset = 1;    // subtracted from stored labels (ImageNet: 1..1000 -> 0..999)
  TransformOptions transform;  // training flag is taken from `training`
  // Training: each epoch's crop (progressive resizing) instead of transform.image_size.
  std::optional<ImageSizeSchedule> image_sizes;
  bool pin_memory = false;  // batches in pinned memory, for asynchronous copies to a GPU
  int reader_threads = 2;
  int decode_threads = 1;
  int64_t prefetch_batches = 2;     // decoded batches ready ahead of the consumer
  int64_t shuffle_buffer = 1024;    // records (training)
  int64_t block_records = 64;       // records per read; ImageNet: ~7 MB
  std::string index_cache_dir;      // where index files go when the data folder is read-only
  bool fail_on_bad_record = false;  // false: skip (and count) bad records
  double max_bad_fraction = 0.001;  // skip: error once more than this fraction is bad
  // next_batch() waits at most this long for a batch (DeadlineExceeded), and gives up soon after
  // a stop signal (StopRequested): base/bounded_wait.h.
  std::chrono::seconds wait_timeout{300};
};

class TFRecordSource : public BatchSource {
 public:
  // Loads (or builds) every file's index; throws UserError for missing data, damage beyond the
  // policy, or fewer records than one global batch (training).
  explicit TFRecordSource(TFRecordSourceOptions options);
  ~TFRecordSource() override;  // stops and joins the threads

  int64_t samples_per_epoch() const override { return total_records(); }
  void start_epoch(int64_t epoch, int64_t position = 0) override;
  int64_t batches_left() const override;
  // Blocks until the batch is ready (bounded: wait_timeout). A skipped record's row is filled with
  // another image of the batch in training (the batch keeps its size) and dropped in evaluation.
  Batch next_batch() override;

  int64_t total_records() const;         // in all files (intact ones)
  int64_t bad_records() const override;  // skipped so far, index damage included

  struct Epoch;  // one epoch's plan, buffers and threads (tfrecord_source.cpp)

 private:
  void stop_epoch();
  int64_t image_size_of(int64_t epoch) const;  // the crop of `epoch` (training: the schedule's)
  int64_t largest_image_size() const;          // the run's largest crop: the buffers' size

  TFRecordSourceOptions options_;
  std::vector<std::vector<IndexEntry>> indexes_;  // per file
  std::vector<int64_t> first_record_;             // (files + 1) prefix sums
  int64_t index_bad_ = 0;                         // records lost to broken framing
  int64_t bad_in_past_epochs_ = 0;                // records skipped by epochs already stopped
  // Recycled between epochs, used under the epoch's mutex (see Note [Recycled buffers]).
  std::vector<std::string> spare_payloads_;  // record buffers the decoders are done with
  std::vector<at::Tensor> image_pool_;       // pageable batch buffers
  std::unique_ptr<Epoch> epoch_;
};

}  // namespace trainer
