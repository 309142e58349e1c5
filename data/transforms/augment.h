// Per-sample transforms of the ImageNet recipe, as crop rectangles in source pixels so that only
// the crop is decoded: RandomResizedCrop (torchvision's algorithm, area 0.08-1, ratio 3/4-4/3)
// with a random horizontal flip for training; "shorter side to 256, centre 224" for evaluation.
// Randomness comes from one seed per sample, so results do not depend on thread scheduling.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <string_view>

#include "data/formats/jpeg/decode.h"
#include "data/transforms/augment_policy.h"

namespace trainer {

struct RandomResizedCropOptions {
  double min_area = 0.08, max_area = 1.0;               // fraction of the image area
  double min_ratio = 3.0 / 4.0, max_ratio = 4.0 / 3.0;  // width / height
};

// torchvision.transforms.RandomResizedCrop.get_params: ten tries at a random area and log-uniform
// aspect ratio, else the largest centred crop with the ratio clamped into range.
CropRect random_resized_crop(ImageSize image, std::mt19937_64& rng,
                             const RandomResizedCropOptions& options = {});

// The region of the source that "resize the shorter side to `resize`, then take the centred
// `crop` x `crop`" keeps.
CropRect centre_crop_region(ImageSize image, int resize, int crop);

struct TransformOptions {
  bool training = true;
  int image_size = 224;  // output crop, pixels
  int val_resize = 256;  // evaluation: shorter side before the centre crop
  RandomResizedCropOptions crop;
  AugmentPolicyOptions
      policy;  // training: after the crop and flip (data/transforms/augment_policy.h)
};

// Decodes and transforms one image into `out` ((image_size, image_size, 3) uint8) using the
// sample's own `seed` (training crop, flip and augmentation policy). False + `error` when the image
// is undecodable.
bool transform_image(std::string_view encoded, const TransformOptions& options, uint64_t seed,
                     uint8_t* out, std::string* error);

}  // namespace trainer
