// The seam between the input pipeline and the trainer: a source of uint8 image batches with labels.
// Every source (synthetic, in-memory, TFRecord) yields the same Batch, so the trainer does not know
// where images come from; normalisation happens on the device (data/transforms/device_input.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace trainer {

struct Batch {
  at::Tensor images;  // (N, H, W, 3) uint8 NHWC; host memory (pinned where a GPU uses it) or device
  at::Tensor labels;  // (N) int64, class index in [0, num_classes)
  at::Tensor ids;     // (N) int64, CPU: each image's sample id (record or image index); undefined
                      // for synthetic data
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;

  // Samples (images) in one epoch, over all ranks. Training progress is counted in these.
  virtual int64_t samples_per_epoch() const = 0;

  // Positions the source at sample `position` of epoch `epoch` (0 unless resuming mid-epoch).
  // A training epoch's order depends only on the seed and the epoch, and each step takes the next
  // global batch of it (Note [Elastic epoch order] in data/sources/step_shares.h), so a resumed
  // run, at any world size, continues with exactly the samples not yet trained. The epoch's images
  // are of the epoch's size, a function of the epoch alone (Note [Image size per epoch] in
  // data/sources/image_size_schedule.h). Evaluation sources start at 0.
  virtual void start_epoch(int64_t epoch, int64_t position = 0) = 0;

  // Batches next_batch() yields from the start position to the end of the epoch. Training: one
  // per step, the same count on every rank, every batch full but the epoch's last, which may be
  // short or (on some ranks) empty. Evaluation: every image once, the last batch possibly short.
  virtual int64_t batches_left() const = 0;

  // The next batch of the current epoch; calling it more than batches_left() times is a bug.
  virtual Batch next_batch() = 0;

  // Damaged records skipped so far by this rank's source (0 for sources that cannot have any).
  virtual int64_t bad_records() const { return 0; }
};

}  // namespace trainer
