#include "data/datasets/generated_dataset.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

namespace trainer {

LabelledImages generate_labelled_images(const GeneratedDatasetOptions& options) {
  const int64_t m = options.images, k = options.num_classes, s = options.image_size;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);

  at::Tensor labels = at::arange(m, at::TensorOptions().dtype(at::kLong)).remainder(k);
  at::Tensor c = labels.to(at::kFloat).view({m, 1, 1, 1});  // (M, 1, 1, 1)

  // Stripes: orientation pi*c/k, frequency 2 + c mod 4 cycles per image, random phase.
  at::Tensor angle = c * (M_PI / static_cast<double>(k));
  at::Tensor frequency = 2.0 + labels.remainder(4).to(at::kFloat).view({m, 1, 1, 1});
  at::Tensor phase = at::rand({m, 1, 1, 1}, generator, f32) * (2 * M_PI);
  at::Tensor axis = at::arange(s, f32) / static_cast<double>(s);
  at::Tensor y = axis.view({1, s, 1, 1}), x = axis.view({1, 1, s, 1});
  at::Tensor stripes =
      at::sin(2 * M_PI * frequency * (x * at::cos(angle) + y * at::sin(angle)) + phase);

  // Colour: a hue per class on the RGB colour wheel.
  at::Tensor channel_offset = at::arange(3, f32).view({1, 1, 1, 3}) * (2 * M_PI / 3);
  at::Tensor colour = 128 + 70 * at::cos(c * (2 * M_PI / static_cast<double>(k)) + channel_offset);

  at::Tensor noise = at::randn({m, s, s, 3}, generator, f32) * 20;
  at::Tensor images = (colour + 50 * stripes + noise).clamp(0, 255).round().to(at::kByte);
  return {images.contiguous(), labels};
}

}  // namespace trainer
