// Synthetic data, as tf_cnn_benchmarks' default: one fixed random batch kept on the device and
// returned every step, so a benchmark measures the model and the gradient path, not the input.
#pragma once

#include <c10/core/Device.h>

#include "data/batch_source.h"

namespace trainer {

struct SyntheticOptions {
  int64_t batch_size = 256;
  int64_t image_size = 224;
  int64_t num_classes = 1000;
  int64_t batches_per_epoch = 100;
  uint64_t seed = 0;
};

class SyntheticSource : public BatchSource {
 public:
  SyntheticSource(const SyntheticOptions& options, c10::Device device);
  int64_t batches_per_epoch() const override { return options_.batches_per_epoch; }
  void start_epoch(int64_t /*epoch*/, int64_t /*first_batch*/) override {}
  Batch next_batch() override { return batch_; }

 private:
  SyntheticOptions options_;
  Batch batch_;
};

}  // namespace trainer
