#include "data/memory_source.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "src/check.h"

namespace trainer {

MemorySource::MemorySource(LabelledImages data, const MemorySourceOptions& options)
    : data_(std::move(data)), options_(options) {
  USER_CHECK(options.batch_size > 0, "batch_size must be positive, got ", options.batch_size);
  TORCH_INTERNAL_ASSERT(options.world_size > 0 && options.rank >= 0 &&
                        options.rank < options.world_size);
  USER_CHECK(!options.training || data_.images.size(0) >= options.batch_size * options.world_size,
             "the dataset has ", data_.images.size(0), " images, fewer than one batch of ",
             options.batch_size, " per rank on ", options.world_size,
             " ranks; lower batch_size or generate more images");
  start_epoch(0);
}

int64_t MemorySource::batches_per_epoch() const {
  const int64_t b = options_.batch_size;
  if (options_.training) return data_.images.size(0) / options_.world_size / b;  // same on all
  return (order_.size(0) + b - 1) / b;
}

void MemorySource::start_epoch(int64_t epoch, int64_t first_batch) {
  const int64_t m = data_.images.size(0);
  if (options_.training) {
    // Knuth's multiplicative hash spreads consecutive epochs over unrelated generator seeds.
    auto generator = at::make_generator<at::CPUGeneratorImpl>(
        options_.seed + 0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(epoch + 1));
    order_ = at::randperm(m, generator, at::TensorOptions().dtype(at::kLong));
  } else {
    order_ = at::arange(m, at::TensorOptions().dtype(at::kLong));
  }
  order_ = order_.slice(0, options_.rank, m, options_.world_size);  // this rank's shard
  next_index_ = first_batch * options_.batch_size;
}

Batch MemorySource::next_batch() {
  const int64_t m = order_.size(0);
  TORCH_INTERNAL_ASSERT(next_index_ < m, "next_batch() called past the end of the epoch");
  const int64_t count = std::min(options_.batch_size, m - next_index_);
  at::Tensor indices = order_.slice(0, next_index_, next_index_ + count);
  next_index_ += count;
  Batch batch{data_.images.index_select(0, indices), data_.labels.index_select(0, indices)};
  if (options_.pin_memory) {
    batch.images = batch.images.pin_memory();
    batch.labels = batch.labels.pin_memory();
  }
  return batch;
}

}  // namespace trainer
