// The seam between the input pipeline and the trainer: a source of uint8 image batches with labels.
// Every source (synthetic, in-memory, TFRecord) yields the same Batch, so the trainer does not know
// where images come from; normalisation happens on the device (data/device_input.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace trainer {

struct Batch {
  at::Tensor images;  // (N, H, W, 3) uint8 NHWC; host memory (pinned where a GPU uses it) or device
  at::Tensor labels;  // (N) int64, class index in [0, num_classes)
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;

  // Batches in one epoch. A training source yields the same count on every rank; an evaluation
  // source yields every image once, its last batch possibly short.
  virtual int64_t batches_per_epoch() const = 0;

  // Positions the source at batch `first_batch` of epoch `epoch` (0 unless resuming mid-epoch).
  // The order of an epoch depends only on the seed and the epoch, so a resumed run sees the same
  // batches as an uninterrupted one.
  virtual void start_epoch(int64_t epoch, int64_t first_batch = 0) = 0;

  // The next batch of the current epoch; calling it more than batches_per_epoch() times is a bug.
  virtual Batch next_batch() = 0;
};

}  // namespace trainer
