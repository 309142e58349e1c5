// A small labelled image dataset generated in memory, for the smoke run and the tests: each class
// has its own colour and stripe orientation, with a random phase and noise per image, so a network
// can learn it in a few hundred steps while no two images are alike.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace trainer {

struct LabelledImages {
  at::Tensor images;  // (M, H, W, 3) uint8
  at::Tensor labels;  // (M) int64, balanced over the classes
};

struct GeneratedDatasetOptions {
  int64_t num_classes = 10;
  int64_t images = 1000;
  int64_t image_size = 64;
  uint64_t seed = 0;  // a different seed draws a different split of the same classes
};

LabelledImages generate_labelled_images(const GeneratedDatasetOptions& options);

}  // namespace trainer
