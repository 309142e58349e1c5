#include "data/sources/memory_source.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "base/user_error.h"
#include "data/sources/step_shares.h"

namespace trainer {
namespace {

// (N, S, S, 3) uint8 -> (N, size, size, 3) uint8, bilinear and antialiased as torchvision's
// Resize: a smaller epoch sees the same pictures, not a crop of them.
at::Tensor resize_images(const at::Tensor& images, int64_t size) {
  const at::Tensor nchw = images.permute({0, 3, 1, 2}).to(at::kFloat);
  const at::Tensor resized =
      at::_upsample_bilinear2d_aa(nchw, {size, size}, /*align_corners=*/false);
  return resized.round().clamp(0, 255).to(at::kByte).permute({0, 2, 3, 1}).contiguous();
}

}  // namespace

MemorySource::MemorySource(LabelledImages data, const MemorySourceOptions& options)
    : data_(std::move(data)), options_(options) {
  USER_CHECK(options.batch_size > 0, "batch_size must be positive, got ", options.batch_size);
  TORCH_INTERNAL_ASSERT(options.world_size > 0 && options.rank >= 0 &&
                        options.rank < options.world_size);
  USER_CHECK(!options.training || data_.images.size(0) >= options.batch_size * options.world_size,
             "the dataset has ", data_.images.size(0), " images, fewer than one batch of ",
             options.batch_size, " per rank on ", options.world_size,
             " ranks; lower batch_size or generate more images");
  TORCH_INTERNAL_ASSERT(!options.image_sizes ||
                        options.image_sizes->largest() == data_.images.size(1));
  start_epoch(0);
}

void MemorySource::start_epoch(int64_t epoch, int64_t position) {
  const int64_t m = data_.images.size(0), b = options_.batch_size;
  const auto longs = at::TensorOptions().dtype(at::kLong);
  next_index_ = 0;
  image_size_ = options_.training && options_.image_sizes ? options_.image_sizes->at(epoch)
                                                          : data_.images.size(1);
  if (!options_.training) {
    order_ = at::arange(options_.rank, m, options_.world_size, longs);
    batches_left_ = (order_.size(0) + b - 1) / b;
    return;
  }
  // Knuth's multiplicative hash spreads consecutive epochs over unrelated generator seeds.
  auto generator = at::make_generator<at::CPUGeneratorImpl>(
      options_.seed + 0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(epoch + 1));
  const at::Tensor permutation = at::randperm(m, generator, longs);
  const int64_t end = epoch_end(m, position, options_.whole_steps_of);
  const std::vector<int64_t> order(permutation.data_ptr<int64_t>(),
                                   permutation.data_ptr<int64_t>() + end);
  order_ = at::tensor(rank_samples(order, position, b, options_.rank, options_.world_size), longs);
  batches_left_ = steps_left(end, position, b * options_.world_size);
}

Batch MemorySource::next_batch() {
  TORCH_INTERNAL_ASSERT(batches_left_ > 0, "next_batch() called past the end of the epoch");
  --batches_left_;
  const int64_t m = order_.size(0);
  // The epoch's last batch takes what is left: fewer, none, or one more (Note [Elastic epoch
  // order] in data/sources/step_shares.h).
  const int64_t count =
      batches_left_ == 0 ? m - next_index_ : std::min(options_.batch_size, m - next_index_);
  at::Tensor indices = order_.slice(0, next_index_, next_index_ + count);
  next_index_ += count;
  Batch batch{data_.images.index_select(0, indices), data_.labels.index_select(0, indices),
              indices};
  if (image_size_ != batch.images.size(1)) batch.images = resize_images(batch.images, image_size_);
  if (options_.pin_memory) {
    batch.images = batch.images.pin_memory();
    batch.labels = batch.labels.pin_memory();
  }
  return batch;
}

}  // namespace trainer
