// Batches drawn from labelled images held in host memory (the generated smoke dataset), sharded
// over ranks. Training: every epoch a permutation from (seed, epoch), the same on all ranks, dealt
// out step by step (Note [Elastic epoch order] in data/sources/step_shares.h). Evaluation: rank r
// takes images r, r + world_size, ... in order, so each image is seen exactly once across ranks;
// the last batch may be short. With progressive resizing, training batches are resized to the
// epoch's size.
#pragma once

#include <optional>

#include "data/datasets/generated_dataset.h"
#include "data/sources/batch_source.h"
#include "data/sources/image_size_schedule.h"

namespace trainer {

struct MemorySourceOptions {
  int64_t batch_size = 32;
  bool training = true;     // shuffle; steps of batch_size x world_size images
  uint64_t seed = 0;        // shuffle seed, shared by all ranks; the epoch is added
  bool pin_memory = false;  // allocate batches in pinned memory for asynchronous copies to a GPU
  int rank = 0;             // this process's shard
  int world_size = 1;       // number of shards
  // Training: each epoch's image size; the images are held at its largest and resized down.
  std::optional<ImageSizeSchedule> image_sizes;
  // Training, drop_last: each epoch ends at its last whole step of this many images (Note [The
  // last partial step] in data/sources/step_shares.h); 0: its last step takes what is left.
  int64_t whole_steps_of = 0;
};

class MemorySource : public BatchSource {
 public:
  MemorySource(LabelledImages data, const MemorySourceOptions& options);
  int64_t samples_per_epoch() const override { return data_.images.size(0); }
  void start_epoch(int64_t epoch, int64_t position = 0) override;
  int64_t batches_left() const override { return batches_left_; }
  Batch next_batch() override;

 private:
  LabelledImages data_;
  MemorySourceOptions options_;
  at::Tensor order_;          // this rank's images of the epoch from the start position, in order
  int64_t next_index_ = 0;    // position in order_ of the next batch's first image
  int64_t batches_left_ = 0;  // batches to the end of the epoch
  int64_t image_size_ = 0;    // this epoch's (Note [Image size per epoch])
};

}  // namespace trainer
