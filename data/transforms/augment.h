// Per-sample transforms of the ImageNet recipe, as crop rectangles in source pixels so that only
// the crop is decoded: RandomResizedCrop (torchvision's algorithm, area 0.08-1, ratio 3/4-4/3)
// or TensorFlow's sample_distorted_bounding_box around the record's boxes (the MLPerf TF2
// reference's), with a random horizontal flip for training; "shorter side to 256, centre 224" for
// evaluation.
// Randomness comes from one seed per sample, so results do not depend on thread scheduling.
#pragma once

#include <array>
#include <cstddef>
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

// A box of a record, normalised to [0, 1] and in the order the records' features and
// ImageExample::boxes keep: {xmin, ymin, xmax, ymax}.
using NormalisedBox = std::array<float, 4>;

// A view of a record's boxes (none: `size` 0).
struct BoxList {
  const NormalisedBox* data = nullptr;
  size_t size = 0;
};

// tf.image.sample_distorted_bounding_box's arguments, at the values the MLPerf ResNet-50 TF2
// reference passes (imagenet_preprocessing.py _decode_crop_and_flip).
struct DistortedBoxOptions {
  float min_object_covered = 0.1f;
  float min_aspect = 0.75f, max_aspect = 1.33f;  // width / height
  float min_area = 0.05f, max_area = 1.0f;       // fraction of the image area
  int max_attempts = 100;
};

// TensorFlow's SampleDistortedBoundingBox kernel (sample_distorted_bounding_box_op.cc), its
// algorithm with our generator: up to max_attempts times, an aspect ratio uniform in range, a
// height uniform among the integers whose crop area lies in the area range (width =
// round(height * aspect), clamped to the image), an offset uniform in [0, side - crop side)
// (TensorFlow's bound: the crop never touches the far edge unless it spans the image); the first
// crop that covers at least min_object_covered of the area of some box (in whole pixels,
// corners truncated as TensorFlow does) is taken, else the whole image. No boxes: the whole
// image is the box (use_image_if_no_bounding_boxes). Coordinates outside [0, 1], which
// TensorFlow rejects, are clamped.
CropRect distorted_bounding_box_crop(ImageSize image, BoxList boxes, std::mt19937_64& rng,
                                     const DistortedBoxOptions& options = {});

// The region of the source that "resize the shorter side to `resize`, then take the centred
// `crop` x `crop`" keeps.
CropRect centre_crop_region(ImageSize image, int resize, int crop);

// The training crop: torchvision's RandomResizedCrop, or the MLPerf TF2 reference's
// sample_distorted_bounding_box over the record's boxes.
enum class TrainCrop { kRandomResized, kDistortedBoundingBox };

struct TransformOptions {
  bool training = true;
  TrainCrop train_crop = TrainCrop::kRandomResized;
  int image_size = 224;  // output crop, pixels
  int val_resize = 256;  // evaluation: shorter side before the centre crop
  RandomResizedCropOptions crop;
  DistortedBoxOptions distorted_box;  // train_crop = kDistortedBoundingBox
  AugmentPolicyOptions
      policy;  // training: after the crop and flip (data/transforms/augment_policy.h)
};

// Decodes and transforms one image into `out` ((image_size, image_size, 3) uint8) using the
// sample's own `seed` (training crop, flip and augmentation policy). `boxes`: the record's boxes,
// which only the distorted_bounding_box crop reads. False + `error` when the image is
// undecodable.
bool transform_image(std::string_view encoded, const TransformOptions& options, uint64_t seed,
                     uint8_t* out, std::string* error, BoxList boxes = {});

}  // namespace trainer
