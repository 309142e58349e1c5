// Augmentation policies in transform_image: 'none' leaves the crop and flip as they were, the
// policy draws follow the crop and flip draws of the same seed, and the output is a function of
// the seed alone, whichever thread computes it. Pixel parity with torchvision is in
// tests/data/test_augment_parity.py.
#include <gtest/gtest.h>

#include <cmath>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <thread>
#include <vector>

#include "data/transforms/augment.h"
#include "data/transforms/augment_policy.h"

namespace trainer {
namespace {

constexpr int kSize = 64;  // output crop, pixels

// A JPEG with texture everywhere, so that every op changes some pixels.
std::string test_jpeg() {
  cv::Mat rgb(150, 200, CV_8UC3);
  for (int y = 0; y < rgb.rows; ++y)
    for (int x = 0; x < rgb.cols; ++x)
      rgb.at<cv::Vec3b>(y, x) = {
          cv::saturate_cast<uint8_t>(40 + x), cv::saturate_cast<uint8_t>(30 + y),
          cv::saturate_cast<uint8_t>(128 + 90 * std::sin(x * 0.13) * std::cos(y * 0.11))};
  std::vector<uint8_t> bytes;
  cv::imencode(".jpg", rgb, bytes, {cv::IMWRITE_JPEG_QUALITY, 95});
  return std::string(bytes.begin(), bytes.end());
}

cv::Mat transform(const std::string& jpeg, const TransformOptions& options, uint64_t seed) {
  cv::Mat out(kSize, kSize, CV_8UC3);
  std::string error;
  EXPECT_TRUE(transform_image(jpeg, options, seed, out.data, &error)) << error;
  return out;
}

bool equal(const cv::Mat& a, const cv::Mat& b) { return cv::norm(a, b, cv::NORM_INF) == 0; }

TransformOptions training(AutoAugmentPolicy policy, double erasing = 0) {
  TransformOptions o;
  o.image_size = kSize;
  o.policy.policy = policy;
  o.policy.random_erasing = erasing;
  return o;
}

const AutoAugmentPolicy kPolicies[] = {AutoAugmentPolicy::kTrivialAugmentWide,
                                       AutoAugmentPolicy::kRandAugment,
                                       AutoAugmentPolicy::kAutoAugmentImageNet};

// With policy none, transform_image is RandomResizedCrop then the flip, from the seed's first
// draws, and nothing else: rebuilt here from the public pieces.
TEST(AugmentPolicy, NoneLeavesTheCropAndFlipUnchanged) {
  const std::string jpeg = test_jpeg();
  for (uint64_t seed = 0; seed < 12; ++seed) {
    std::mt19937_64 rng(seed);
    const CropRect crop = random_resized_crop({200, 150}, rng);
    const bool flip = (rng() >> 63) != 0;
    cv::Mat expected(kSize, kSize, CV_8UC3);
    std::string error;
    ASSERT_TRUE(decode_crop_resize(jpeg, crop, kSize, kSize, expected.data, &error)) << error;
    if (flip) cv::flip(expected, expected, 1);
    EXPECT_TRUE(equal(transform(jpeg, training(AutoAugmentPolicy::kNone), seed), expected))
        << "seed " << seed;
  }
}

// See Note [Augmentation draws]: the policy continues the seed's stream after the crop and flip,
// so the same crop is augmented, and the crop is the one 'none' gives.
TEST(AugmentPolicy, DrawsFollowTheCropAndFlipOfTheSameSeed) {
  const std::string jpeg = test_jpeg();
  for (AutoAugmentPolicy policy : kPolicies)
    for (uint64_t seed = 0; seed < 8; ++seed) {
      cv::Mat expected = transform(jpeg, training(AutoAugmentPolicy::kNone), seed);
      std::mt19937_64 rng(seed);
      random_resized_crop({200, 150}, rng);
      rng();  // the flip
      const TransformOptions options = training(policy, /*erasing=*/0.5);
      apply_augment_policy(options.policy, expected.data, kSize, kSize, rng);
      EXPECT_TRUE(equal(transform(jpeg, options, seed), expected))
          << "policy " << int(policy) << " seed " << seed;
    }
}

// The same seed gives the same pixels, also computed by other threads at the same time; other
// seeds give other augmentations, and the policy does change images.
TEST(AugmentPolicy, OutputIsAFunctionOfTheSeed) {
  const std::string jpeg = test_jpeg();
  constexpr int kSeeds = 24;
  for (AutoAugmentPolicy policy : kPolicies) {
    const TransformOptions options = training(policy, /*erasing=*/0.25);
    std::vector<cv::Mat> serial;
    int changed = 0;
    for (uint64_t seed = 0; seed < kSeeds; ++seed) {
      serial.push_back(transform(jpeg, options, seed));
      changed += !equal(serial.back(), transform(jpeg, training(AutoAugmentPolicy::kNone), seed));
    }
    EXPECT_GE(changed, kSeeds / 3) << "policy " << int(policy);
    std::vector<cv::Mat> parallel(kSeeds);
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t)  // each thread takes every third seed, backwards
      threads.emplace_back([&, t] {
        for (int seed = kSeeds - 1 - t; seed >= 0; seed -= 3)
          parallel[seed] = transform(jpeg, options, seed);
      });
    for (auto& thread : threads) thread.join();
    for (int seed = 0; seed < kSeeds; ++seed)
      EXPECT_TRUE(equal(serial[seed], parallel[seed])) << "policy " << int(policy) << " " << seed;
  }
}

// RandomErasing.get_params: the rectangle lies inside, strictly smaller than the image, with an
// area of 2-33% of it (up to rounding of each side) and a height / width ratio in 0.3-3.3.
TEST(AugmentPolicy, RandomErasingRectangles) {
  std::mt19937_64 rng(7);
  int found = 0;
  for (int i = 0; i < 500; ++i) {
    EraseRect r;
    if (!random_erasing_rect(kSize, kSize, rng, &r)) continue;
    ++found;
    ASSERT_GE(r.top, 0);
    ASSERT_GE(r.left, 0);
    ASSERT_LT(r.height, kSize);
    ASSERT_LT(r.width, kSize);
    ASSERT_LE(r.top + r.height, kSize);
    ASSERT_LE(r.left + r.width, kSize);
    const double area = double(r.height) * r.width / (kSize * kSize);
    EXPECT_GT(area, 0.02 * 0.7);
    EXPECT_LT(area, 0.33 * 1.3);
  }
  EXPECT_GT(found, 450);  // only the largest, most elongated tries miss; ten in a row rarely
  // Probability 1: the crop holds a rectangle of the mean colour.
  const cv::Mat erased = transform(test_jpeg(), training(AutoAugmentPolicy::kNone, 1.0), 3);
  int mean_coloured = 0;
  for (int y = 0; y < kSize; ++y)
    for (int x = 0; x < kSize; ++x)
      mean_coloured += erased.at<cv::Vec3b>(y, x) == cv::Vec3b(124, 116, 104);
  EXPECT_GE(mean_coloured, int(0.02 * 0.7 * kSize * kSize));
}

TEST(AugmentPolicy, NamesAndSpaces) {
  AutoAugmentPolicy policy;
  EXPECT_TRUE(policy_from_name("randaugment", &policy));
  EXPECT_EQ(policy, AutoAugmentPolicy::kRandAugment);
  EXPECT_FALSE(policy_from_name("RandAugment", &policy));
  EXPECT_EQ(augmentation_space(AutoAugmentPolicy::kTrivialAugmentWide, 224, 224).size(), 14u);
  EXPECT_EQ(augmentation_space(AutoAugmentPolicy::kRandAugment, 224, 224).size(), 14u);
  EXPECT_EQ(augmentation_space(AutoAugmentPolicy::kAutoAugmentImageNet, 224, 224).size(), 14u);
  EXPECT_TRUE(augmentation_space(AutoAugmentPolicy::kNone, 224, 224).empty());
}

}  // namespace
}  // namespace trainer
