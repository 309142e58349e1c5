#include "data/sources/synthetic_source.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/randint.h>

#include <algorithm>

#include "data/sources/step_shares.h"

namespace trainer {

SyntheticSource::SyntheticSource(const SyntheticOptions& options, c10::Device device)
    : options_(options), image_size_(options.image_size) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  // Room for the largest share of a step (Note [Elastic epoch order]): batch_size + 1, or 3;
  // and for the largest image size, an epoch's batch being a view of the first bytes
  // (Note [Image size per epoch]): random bytes whatever the size, and no allocation per epoch.
  const int64_t n = std::max<int64_t>(options.batch_size + 1, 3);
  const int64_t s = options.image_sizes ? options.image_sizes->largest() : options.image_size;
  pixels_ = at::randint(0, 256, {n * s * s * 3}, generator, at::TensorOptions().dtype(at::kByte))
                .to(device);
  labels_ =
      at::randint(0, options.num_classes, {n}, generator, at::TensorOptions().dtype(at::kLong))
          .to(device);
  start_epoch(0, 0);
}

int64_t SyntheticSource::samples_per_epoch() const {
  return options_.batches_per_epoch * options_.batch_size * options_.world_size;
}

void SyntheticSource::start_epoch(int64_t epoch, int64_t position) {
  image_size_ = options_.image_sizes ? options_.image_sizes->at(epoch) : options_.image_size;
  position_ = position;
  end_ = epoch_end(samples_per_epoch(), position, options_.whole_steps_of);
}

int64_t SyntheticSource::batches_left() const {
  return steps_left(end_, position_, options_.batch_size * options_.world_size);
}

Batch SyntheticSource::next_batch() {
  const int64_t global = options_.batch_size * options_.world_size;
  const int64_t n = step_samples(end_, position_, global);
  TORCH_INTERNAL_ASSERT(n > 0, "next_batch() called past the end of the epoch");
  position_ += n;
  const int64_t rows = share_of(n, options_.batch_size, options_.rank, options_.world_size).count;
  const int64_t s = image_size_;
  return {
      pixels_.narrow(0, 0, rows * s * s * 3).view({rows, s, s, 3}), labels_.narrow(0, 0, rows), {}};
}

}  // namespace trainer
