// The training crop's window before any pixel is decoded: the MLPerf reference's
// sample_distorted_bounding_box over a record's boxes, and torchvision's RandomResizedCrop.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "data/transforms/augment.h"

namespace trainer {
namespace {

// The area of `c` inside the box {xmin, ymin, xmax, ymax}, corners truncated to pixels as
// TensorFlow's kernel does, over the box's area.
double covered(const CropRect& c, ImageSize image, const NormalisedBox& b) {
  const int x0 = int(b[0] * image.width), y0 = int(b[1] * image.height);
  const int x1 = int(b[2] * image.width), y1 = int(b[3] * image.height);
  const int w = std::min(c.x + c.width, x1) - std::max(c.x, x0);
  const int h = std::min(c.y + c.height, y1) - std::max(c.y, y0);
  return w > 0 && h > 0 ? double(w) * h / (double(x1 - x0) * (y1 - y0)) : 0.0;
}

bool whole(const CropRect& c, ImageSize image) {
  return c.x == 0 && c.y == 0 && c.width == image.width && c.height == image.height;
}

// Every crop lies in the image, at least a pixel, in the area and aspect ranges and covering a
// tenth of some box, or is the whole image (no crop found in 100 attempts).
TEST(DistortedBoundingBoxCrop, WithinBoundsAreaRatioAndCover) {
  const std::vector<std::vector<NormalisedBox>> box_sets = {
      {},
      {{0.4f, 0.4f, 0.6f, 0.65f}},
      {{0.0f, 0.0f, 1.0f, 1.0f}},
      {{0.05f, 0.1f, 0.3f, 0.4f}, {0.5f, 0.5f, 0.95f, 0.9f}}};
  std::mt19937_64 rng(7);
  for (const auto& boxes : box_sets) {
    int fallbacks = 0;
    for (int i = 0; i < 2000; ++i) {
      const ImageSize image{500 - i % 200, 375 + i % 150};
      const CropRect c = distorted_bounding_box_crop(image, {boxes.data(), boxes.size()}, rng);
      ASSERT_GE(c.x, 0);
      ASSERT_GE(c.y, 0);
      ASSERT_GE(c.width, 1);
      ASSERT_GE(c.height, 1);
      ASSERT_LE(c.x + c.width, image.width);
      ASSERT_LE(c.y + c.height, image.height);
      if (whole(c, image)) {
        ++fallbacks;
        continue;
      }
      const double area = double(c.width) * c.height / (double(image.width) * image.height);
      EXPECT_GE(area, 0.05);
      EXPECT_LE(area, 1.0);
      const double ratio = double(c.width) / c.height;
      EXPECT_GE(ratio, 0.74);
      EXPECT_LE(ratio, 1.34);
      double best = boxes.empty() ? area : 0.0;  // no boxes: the image is the box
      for (const NormalisedBox& b : boxes) best = std::max(best, covered(c, image, b));
      EXPECT_GE(best, 0.1);
    }
    EXPECT_LT(fallbacks, 200) << boxes.size() << " boxes";
  }
}

// min_object_covered 1 on a small box: crops that contain the whole box exist, and are found.
// An impossible request (a whole-image box covered by at most 1% of the image) gives the whole
// image; so does a box of less than a pixel, which counts for nothing.
TEST(DistortedBoundingBoxCrop, CoversAllOfATinyBoxOrFallsBackToTheImage) {
  const ImageSize image{320, 240};
  std::mt19937_64 rng(11);
  DistortedBoxOptions all;
  all.min_object_covered = 1.0f;
  const NormalisedBox tiny{0.45f, 0.45f, 0.5f, 0.5f};
  int cropped = 0;
  for (int i = 0; i < 500; ++i) {
    const CropRect c = distorted_bounding_box_crop(image, {&tiny, 1}, rng, all);
    EXPECT_EQ(covered(c, image, tiny), 1.0);
    cropped += !whole(c, image);
  }
  EXPECT_GT(cropped, 450);
  DistortedBoxOptions impossible = all;
  impossible.max_area = 0.01f;
  impossible.min_area = 0.005f;
  const NormalisedBox full{0, 0, 1, 1};
  const NormalisedBox speck{0.5f, 0.5f, 0.501f, 0.501f};
  for (int i = 0; i < 50; ++i) {
    EXPECT_TRUE(whole(distorted_bounding_box_crop(image, {&full, 1}, rng, impossible), image));
    EXPECT_TRUE(whole(distorted_bounding_box_crop(image, {&speck, 1}, rng), image));
  }
  // A 1 x 1 image has one crop: itself.
  EXPECT_TRUE(whole(distorted_bounding_box_crop({1, 1}, {}, rng), ImageSize{1, 1}));
}

// A function of the seed alone; no boxes are the whole image as one box.
TEST(DistortedBoundingBoxCrop, DeterministicPerSeedAndNoBoxesIsTheImage) {
  const ImageSize image{400, 300};
  const NormalisedBox full{0, 0, 1, 1};
  int distinct = 0;
  CropRect previous;
  for (uint64_t seed = 0; seed < 64; ++seed) {
    std::mt19937_64 a(seed), b(seed), c(seed);
    const CropRect first = distorted_bounding_box_crop(image, {}, a);
    const CropRect again = distorted_bounding_box_crop(image, {}, b);
    const CropRect boxed = distorted_bounding_box_crop(image, {&full, 1}, c);
    EXPECT_EQ(std::tie(first.x, first.y, first.width, first.height),
              std::tie(again.x, again.y, again.width, again.height));
    EXPECT_EQ(std::tie(first.x, first.y, first.width, first.height),
              std::tie(boxed.x, boxed.y, boxed.width, boxed.height));
    distinct += std::tie(first.x, first.y, first.width, first.height) !=
                std::tie(previous.x, previous.y, previous.width, previous.height);
    previous = first;
  }
  EXPECT_GT(distinct, 60);
}

TEST(RandomResizedCrop, WithinBoundsAreaAndRatio) {
  std::mt19937_64 rng(3);
  int fallbacks = 0;
  for (int i = 0; i < 2000; ++i) {
    const ImageSize image{500 - i % 200, 375 + i % 150};
    const CropRect c = random_resized_crop(image, rng);
    ASSERT_GE(c.x, 0);
    ASSERT_GE(c.y, 0);
    ASSERT_LE(c.x + c.width, image.width);
    ASSERT_LE(c.y + c.height, image.height);
    const double area = double(c.width) * c.height / (double(image.width) * image.height);
    const double ratio = double(c.width) / c.height;
    if (area > 0.99) ++fallbacks;
    EXPECT_GE(area, 0.075);
    EXPECT_GE(ratio, 0.74);
    EXPECT_LE(ratio, 1.35);
  }
  EXPECT_LT(fallbacks, 200);
  // A very wide image: the fallback clamps the ratio to 4/3, centred.
  std::mt19937_64 rng2(0);
  const CropRect wide = random_resized_crop({4000, 10}, rng2);
  EXPECT_LE(double(wide.width) / wide.height, 4.0 / 3 + 0.2);
}

}  // namespace
}  // namespace trainer
