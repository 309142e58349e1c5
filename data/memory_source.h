// Batches drawn from labelled images held in host memory (the generated smoke dataset), sharded
// over ranks. Training: every epoch a permutation from (seed, epoch), the same on all ranks; rank r
// takes every world_size-th image from position r, and every rank yields the same number of full
// batches (the remainder is dropped). Evaluation: rank r takes images r, r + world_size, ... in
// order, so each image is seen exactly once across ranks; the last batch may be short.
#pragma once

#include "data/batch_source.h"
#include "data/generated_dataset.h"

namespace trainer {

struct MemorySourceOptions {
  int64_t batch_size = 32;
  bool training = true;     // shuffle and drop the last partial batch
  uint64_t seed = 0;        // shuffle seed, shared by all ranks; the epoch is added
  bool pin_memory = false;  // allocate batches in pinned memory for asynchronous copies to a GPU
  int rank = 0;             // this process's shard
  int world_size = 1;       // number of shards
};

class MemorySource : public BatchSource {
 public:
  MemorySource(LabelledImages data, const MemorySourceOptions& options);
  int64_t batches_per_epoch() const override;
  void start_epoch(int64_t epoch, int64_t first_batch = 0) override;
  Batch next_batch() override;

 private:
  LabelledImages data_;
  MemorySourceOptions options_;
  at::Tensor order_;        // (M) int64: this epoch's permutation of the images
  int64_t next_index_ = 0;  // position in order_ of the next batch's first image
};

}  // namespace trainer
