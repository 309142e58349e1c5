// Augmentation policies on the uint8 training crop, after RandomResizedCrop and the flip:
// TrivialAugmentWide, RandAugment and AutoAugment's ImageNet policy as torchvision 0.26's
// transforms.v2 defines them (op lists, magnitude bins, signs, probabilities), then random erasing.
// Every draw comes from the sample's own random stream (Note [Augmentation draws]).
#pragma once

#include <cstdint>
#include <random>
#include <string_view>
#include <vector>

#include "data/transforms/augment_ops.h"

namespace trainer {

enum class AutoAugmentPolicy { kNone, kTrivialAugmentWide, kRandAugment, kAutoAugmentImageNet };

// "none" | "trivialaugment_wide" | "randaugment" | "autoaugment_imagenet" (the config's values);
// false for any other name.
bool policy_from_name(std::string_view name, AutoAugmentPolicy* policy);

struct AugmentPolicyOptions {
  AutoAugmentPolicy policy = AutoAugmentPolicy::kNone;
  int randaugment_num_ops = 2;    // RandAugment: ops applied one after the other
  int randaugment_magnitude = 9;  // RandAugment: the magnitude bin, of 31 (0..30)
  double random_erasing = 0;      // probability of erasing one rectangle; 0: never
  Interpolation interpolation = Interpolation::kNearest;  // of the geometric ops
};

// One op of a policy's augmentation space: its magnitude per bin, as torchvision's float32 tables
// (torch.linspace bit for bit); empty for ops without a magnitude. A signed op's magnitude is
// negated with probability 1/2.
struct OpMagnitudes {
  AugmentOp op;
  std::vector<float> bins;
  bool is_signed;
};

// The space `policy` draws from (its _AUGMENTATION_SPACE, in torchvision's order) for an image of
// `height` x `width`: 31 bins for RandAugment and TrivialAugmentWide, 10 for AutoAugment.
std::vector<OpMagnitudes> augmentation_space(AutoAugmentPolicy policy, int height, int width);

// A rectangle of the image: rows [top, top + height), columns [left, left + width).
struct EraseRect {
  int top = 0, left = 0, height = 0, width = 0;
};

// torchvision's RandomErasing.get_params with scale (0.02, 0.33) and ratio (0.3, 3.3) (height /
// width): ten tries at a random area and log-uniform ratio; false when none fits.
bool random_erasing_rect(int height, int width, std::mt19937_64& rng, EraseRect* rect);

// The erased rectangle's colour on the uint8 crop: torchvision erases after Normalize with value
// 0, i.e. with the ImageNet mean, (0.485, 0.456, 0.406) x 255 rounded.
inline constexpr uint8_t kErasingColour[3] = {124, 116, 104};

// Applies options.policy, then random erasing, in place to `rgb` ((height, width, 3) uint8),
// drawing from `rng`. With policy none and random_erasing 0 it draws nothing and changes nothing.
void apply_augment_policy(const AugmentPolicyOptions& options, uint8_t* rgb, int height, int width,
                          std::mt19937_64& rng);

}  // namespace trainer
