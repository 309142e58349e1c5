// The training transforms on random images: every augmentation op at any magnitude and both
// interpolations, the policies (AutoAugment, RandAugment at any bin and op count,
// TrivialAugmentWide) with random erasing, and the crop samplers (RandomResizedCrop,
// sample_distorted_bounding_box over any boxes, the centre crop), whose rectangles must lie in
// the image. The first bytes choose the image size, the op and the magnitudes; the rest are the
// pixels (repeated to fill the image).
#include <cmath>
#include <random>
#include <vector>

#include "data/transforms/augment.h"
#include "data/transforms/augment_ops.h"
#include "data/transforms/augment_policy.h"
#include "tests/fuzz/fuzz_input.h"

namespace trainer::fuzz {
namespace {

void expect_inside(const CropRect& crop, ImageSize image, const char* sampler) {
  FUZZ_EXPECT(crop.x >= 0 && crop.y >= 0 && crop.width >= 1 && crop.height >= 1 &&
                  crop.x + crop.width <= image.width && crop.y + crop.height <= image.height,
              std::string(sampler) + " " + std::to_string(crop.x) + "," + std::to_string(crop.y) +
                  " " + std::to_string(crop.width) + "x" + std::to_string(crop.height) + " in " +
                  std::to_string(image.width) + "x" + std::to_string(image.height));
}

void crop_samplers(FuzzInput& input, std::mt19937_64& rng) {
  const ImageSize image{input.integer(1, 20000), input.integer(1, 20000)};
  expect_inside(random_resized_crop(image, rng), image, "random_resized_crop");
  std::vector<NormalisedBox> boxes(input.byte() % 4);
  for (auto& box : boxes)  // outside [0, 1] and inverted too: records are not checked
    for (float& corner : box) corner = static_cast<float>(input.number(-0.5, 1.5));
  DistortedBoxOptions options;
  options.min_object_covered = static_cast<float>(input.number(0, 1));
  expect_inside(distorted_bounding_box_crop(image, {boxes.data(), boxes.size()}, rng, options),
                image, "distorted_bounding_box_crop");
  const int crop = input.integer(1, 512);
  const int resize = input.integer(crop, 600);
  expect_inside(centre_crop_region(image, resize, crop), image, "centre_crop_region");
}

}  // namespace
}  // namespace trainer::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainer;
  fuzz::FuzzInput input(data, size);
  std::mt19937_64 rng(input.integer(0, 65535));
  fuzz::crop_samplers(input, rng);

  const int height = input.integer(1, 48), width = input.integer(1, 48);
  const auto op = static_cast<AugmentOp>(input.byte() % (int(AugmentOp::kInvert) + 1));
  // Magnitudes past every policy's range, and the odd special values.
  double magnitude = input.number(-400, 400);
  if (input.byte() % 8 == 0) magnitude = std::ldexp(input.number(-1, 1), input.integer(-60, 60));
  const auto interpolation = input.byte() % 2 ? Interpolation::kBilinear : Interpolation::kNearest;
  AugmentPolicyOptions policy;
  policy.policy = static_cast<AutoAugmentPolicy>(input.byte() % 4);
  policy.randaugment_num_ops = input.integer(0, 4);
  policy.randaugment_magnitude = input.integer(0, 30);
  policy.random_erasing = input.number(0, 1);
  policy.interpolation = interpolation;

  std::vector<uint8_t> rgb(size_t(height) * width * 3);
  const std::string_view pixels = input.rest();
  for (size_t i = 0; i < rgb.size(); ++i)
    rgb[i] = pixels.empty() ? uint8_t(i) : uint8_t(pixels[i % pixels.size()]);
  apply_augment_op(op, magnitude, rgb.data(), height, width, interpolation);
  apply_augment_policy(policy, rgb.data(), height, width, rng);
  EraseRect rect;
  if (random_erasing_rect(height, width, rng, &rect)) {
    // A side may round to 0, as in torchvision (which then erases nothing).
    FUZZ_EXPECT(rect.top >= 0 && rect.left >= 0 && rect.height >= 0 && rect.width >= 0 &&
                    rect.top + rect.height <= height && rect.left + rect.width <= width,
                "erasing rectangle outside the image");
    fill_rectangle(rgb.data(), height, width, rect.top, rect.left, rect.height, rect.width,
                   kErasingColour);
  }
  return 0;
}
