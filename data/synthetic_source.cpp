#include "data/synthetic_source.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/randint.h>

namespace trainer {

SyntheticSource::SyntheticSource(const SyntheticOptions& options, c10::Device device)
    : options_(options) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  const int64_t n = options.batch_size, s = options.image_size;
  batch_.images =
      at::randint(0, 256, {n, s, s, 3}, generator, at::TensorOptions().dtype(at::kByte)).to(device);
  batch_.labels =
      at::randint(0, options.num_classes, {n}, generator, at::TensorOptions().dtype(at::kLong))
          .to(device);
}

}  // namespace trainer
