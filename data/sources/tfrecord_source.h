// The ImageNet TFRecord BatchSource: this rank's records of each epoch
// (data/sources/epoch_plan.h) read in multi-MB blocks by reader threads, decoded and augmented by a
// pool of worker threads straight into the batch's (pinned) buffer, and handed out in a fixed order
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
#include "data/sources/tfrecord_source_options.h"

namespace trainer {

class TFRecordEpoch;  // one epoch's plan, buffers and threads (data/sources/tfrecord_epoch.h)
struct EpochWork;
struct Chunk;
struct RecordTable;

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

 private:
  void stop_epoch();
  // Makes options_.record_layout and label_offset concrete: what was asked, else what the first
  // record says (the same on every rank: resolve_record_layout).
  void resolve_layout();
  int64_t image_size_of(int64_t epoch) const;  // the crop of `epoch` (training: the schedule's)
  int64_t largest_image_size() const;          // the run's largest crop: the buffers' size
  std::vector<Chunk> chunks_of(const EpochWork& work, const RecordTable& table) const;

  TFRecordSourceOptions options_;
  std::vector<std::vector<IndexEntry>> indexes_;  // per file
  std::vector<int64_t> first_record_;             // (files + 1) prefix sums
  int64_t index_bad_ = 0;                         // records lost to broken framing
  int64_t bad_in_past_epochs_ = 0;                // records skipped by epochs already stopped
  // Recycled between epochs, used under the epoch's mutex (see Note [Recycled buffers] in
  // tfrecord_epoch.cpp).
  std::vector<std::string> spare_payloads_;  // record buffers the decoders are done with
  std::vector<at::Tensor> image_pool_;       // pageable batch buffers
  std::unique_ptr<TFRecordEpoch> epoch_;     // the epoch under way
};

}  // namespace trainer
