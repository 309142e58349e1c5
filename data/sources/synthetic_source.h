// Synthetic data, as tf_cnn_benchmarks' default: one fixed random batch kept on the device and
// returned every step, so a benchmark measures the model and the gradient path, not the input.
// An epoch is batches_per_epoch global batches, so that progress counts as for real data.
#pragma once

#include <c10/core/Device.h>

#include <optional>

#include "data/sources/batch_source.h"
#include "data/sources/image_size_schedule.h"

namespace trainer {

struct SyntheticOptions {
  int64_t batch_size = 256;
  int64_t image_size = 224;  // pixels, unless image_sizes is set
  int64_t num_classes = 1000;
  int64_t batches_per_epoch = 100;  // global batches per epoch at this world size
  uint64_t seed = 0;
  int rank = 0;
  int world_size = 1;
  std::optional<ImageSizeSchedule> image_sizes;  // each epoch's size (progressive resizing)
  // drop_last: each epoch ends at its last whole step of this many images (Note [The last
  // partial step] in data/sources/step_shares.h); 0: its last step takes what is left.
  int64_t whole_steps_of = 0;
};

class SyntheticSource : public BatchSource {
 public:
  SyntheticSource(const SyntheticOptions& options, c10::Device device);
  int64_t samples_per_epoch() const override;
  void start_epoch(int64_t epoch, int64_t position) override;
  int64_t batches_left() const override;
  Batch next_batch() override;  // the fixed batch, cut to this rank's share of a short step

 private:
  SyntheticOptions options_;
  at::Tensor pixels_;       // (rows x L x L x 3) uint8 on the device; L: the largest size
  at::Tensor labels_;       // (rows) int64 on the device
  int64_t image_size_ = 0;  // this epoch's (Note [Image size per epoch])
  int64_t position_ = 0;    // samples into the epoch
  int64_t end_ = 0;         // where the epoch ends (epoch_end)
};

}  // namespace trainer
