#include "data/transforms/augment_policy.h"

#include <cmath>
#include <string>

#include "base/seed.h"

namespace trainer {

// Note [Augmentation draws]: a sample's policy draws come from the same std::mt19937_64 as its
// crop and flip, seeded by the sample's own seed, after the crop and flip draws (transform_image
// calls apply_augment_policy last). So a sample's pixels depend on its seed alone: not on the
// decode thread that took it nor on the order threads finish, and a resumed run (which replays
// the same per-sample seeds) augments every image exactly as an unbroken run would. The draws
// follow torchvision's structure (which op, which bin, which sign, in that order), from this
// stream instead of torch's generator.

namespace {

using Op = AugmentOp;

// torch.linspace(start, end, steps) in float32, as ATen's CPU kernel computes it: the first half
// from `start`, the rest back from `end`, each one fused multiply-add (the kernel is compiled
// with FMA contraction). tests/data/test_augment_parity.py compares every table with torch's.
std::vector<float> linspace(double start_value, double end_value, int steps) {
  const float start = static_cast<float>(start_value), end = static_cast<float>(end_value);
  const float step = (end - start) / static_cast<float>(steps - 1);
  std::vector<float> out(steps);
  for (int i = 0; i < steps; ++i)
    out[i] = i < steps / 2 ? std::fma(step, float(i), start)
                           : std::fma(-step, float(steps - 1 - i), end);
  return out;
}

// (8 - arange(steps) / ((steps - 1) / levels)).round(): bits kept, 8 down to 8 - levels.
std::vector<float> posterize_bits(int steps, double levels) {
  const float divisor = static_cast<float>((steps - 1) / levels);
  std::vector<float> out(steps);
  for (int i = 0; i < steps; ++i) out[i] = std::nearbyint(8.0f - float(i) / divisor);
  return out;
}

// The spaces share their op order; `wide` is TrivialAugmentWide's larger ranges.
std::vector<OpMagnitudes> space(int bins, int height, int width, bool wide, bool identity,
                                bool invert) {
  const double shear = wide ? 0.99 : 0.3, rotate = wide ? 135.0 : 30.0, colour = wide ? 0.99 : 0.9;
  const double translate_x = wide ? 32.0 : 150.0 / 331.0 * width;
  const double translate_y = wide ? 32.0 : 150.0 / 331.0 * height;
  std::vector<OpMagnitudes> ops;
  if (identity) ops.push_back({Op::kIdentity, {}, false});
  ops.push_back({Op::kShearX, linspace(0, shear, bins), true});
  ops.push_back({Op::kShearY, linspace(0, shear, bins), true});
  ops.push_back({Op::kTranslateX, linspace(0, translate_x, bins), true});
  ops.push_back({Op::kTranslateY, linspace(0, translate_y, bins), true});
  ops.push_back({Op::kRotate, linspace(0, rotate, bins), true});
  for (Op op : {Op::kBrightness, Op::kColor, Op::kContrast, Op::kSharpness})
    ops.push_back({op, linspace(0, colour, bins), true});
  ops.push_back({Op::kPosterize, posterize_bits(bins, wide ? 6 : 4), false});
  ops.push_back({Op::kSolarize, linspace(1, 0, bins), false});  // threshold / 255
  ops.push_back({Op::kAutoContrast, {}, false});
  ops.push_back({Op::kEqualize, {}, false});
  if (invert) ops.push_back({Op::kInvert, {}, false});
  return ops;
}

// One step of AutoAugment's sub-policy: the op, its probability, its bin of 10 (-1: none).
struct PolicyStep {
  Op op;
  double probability;
  int bin;
};

// AutoAugmentPolicy.IMAGENET: 25 sub-policies of two steps, in torchvision's order.
const PolicyStep kImageNetPolicy[25][2] = {
    {{Op::kPosterize, 0.4, 8}, {Op::kRotate, 0.6, 9}},
    {{Op::kSolarize, 0.6, 5}, {Op::kAutoContrast, 0.6, -1}},
    {{Op::kEqualize, 0.8, -1}, {Op::kEqualize, 0.6, -1}},
    {{Op::kPosterize, 0.6, 7}, {Op::kPosterize, 0.6, 6}},
    {{Op::kEqualize, 0.4, -1}, {Op::kSolarize, 0.2, 4}},
    {{Op::kEqualize, 0.4, -1}, {Op::kRotate, 0.8, 8}},
    {{Op::kSolarize, 0.6, 3}, {Op::kEqualize, 0.6, -1}},
    {{Op::kPosterize, 0.8, 5}, {Op::kEqualize, 1.0, -1}},
    {{Op::kRotate, 0.2, 3}, {Op::kSolarize, 0.6, 8}},
    {{Op::kEqualize, 0.6, -1}, {Op::kPosterize, 0.4, 6}},
    {{Op::kRotate, 0.8, 8}, {Op::kColor, 0.4, 0}},
    {{Op::kRotate, 0.4, 9}, {Op::kEqualize, 0.6, -1}},
    {{Op::kEqualize, 0.0, -1}, {Op::kEqualize, 0.8, -1}},
    {{Op::kInvert, 0.6, -1}, {Op::kEqualize, 1.0, -1}},
    {{Op::kColor, 0.6, 4}, {Op::kContrast, 1.0, 8}},
    {{Op::kRotate, 0.8, 8}, {Op::kColor, 1.0, 2}},
    {{Op::kColor, 0.8, 8}, {Op::kSolarize, 0.8, 7}},
    {{Op::kSharpness, 0.4, 7}, {Op::kInvert, 0.6, -1}},
    {{Op::kShearX, 0.6, 5}, {Op::kEqualize, 1.0, -1}},
    {{Op::kColor, 0.4, 0}, {Op::kEqualize, 0.6, -1}},
    {{Op::kEqualize, 0.4, -1}, {Op::kSolarize, 0.2, 4}},
    {{Op::kSolarize, 0.6, 5}, {Op::kAutoContrast, 0.6, -1}},
    {{Op::kInvert, 0.6, -1}, {Op::kEqualize, 1.0, -1}},
    {{Op::kColor, 0.6, 4}, {Op::kContrast, 1.0, 8}},
    {{Op::kEqualize, 0.8, -1}, {Op::kEqualize, 0.6, -1}},
};

// Uniform integer in [0, n), as augment.cpp draws the crop position.
int draw_index(std::mt19937_64& rng, size_t n) { return static_cast<int>(rng() % uint64_t(n)); }

// The magnitude of `entry` at `bin` (0 for ops without one), negated with probability 1/2 for a
// signed op (torchvision: `if signed and torch.rand(()) <= 0.5`).
double signed_magnitude(const OpMagnitudes& entry, int bin, std::mt19937_64& rng) {
  if (entry.bins.empty()) return 0.0;
  double magnitude = entry.bins[bin];
  if (entry.is_signed && uniform01(rng) <= 0.5) magnitude = -magnitude;
  return magnitude;
}

void auto_augment_imagenet(uint8_t* rgb, int height, int width, Interpolation interpolation,
                           std::mt19937_64& rng) {
  const std::vector<OpMagnitudes> ops =
      augmentation_space(AutoAugmentPolicy::kAutoAugmentImageNet, height, width);
  const PolicyStep* policy = kImageNetPolicy[draw_index(rng, std::size(kImageNetPolicy))];
  for (int i = 0; i < 2; ++i) {
    const PolicyStep& step = policy[i];
    if (!(uniform01(rng) <= step.probability)) continue;
    for (const OpMagnitudes& entry : ops)
      if (entry.op == step.op) {
        const double magnitude = signed_magnitude(entry, std::max(step.bin, 0), rng);
        apply_augment_op(step.op, magnitude, rgb, height, width, interpolation);
        break;
      }
  }
}

}  // namespace

bool policy_from_name(std::string_view name, AutoAugmentPolicy* policy) {
  const std::pair<std::string_view, AutoAugmentPolicy> names[] = {
      {"none", AutoAugmentPolicy::kNone},
      {"trivialaugment_wide", AutoAugmentPolicy::kTrivialAugmentWide},
      {"randaugment", AutoAugmentPolicy::kRandAugment},
      {"autoaugment_imagenet", AutoAugmentPolicy::kAutoAugmentImageNet}};
  for (const auto& [text, value] : names)
    if (name == text) {
      *policy = value;
      return true;
    }
  return false;
}

std::vector<OpMagnitudes> augmentation_space(AutoAugmentPolicy policy, int height, int width) {
  switch (policy) {
    case AutoAugmentPolicy::kTrivialAugmentWide:
      return space(31, height, width, /*wide=*/true, /*identity=*/true, /*invert=*/false);
    case AutoAugmentPolicy::kRandAugment:
      return space(31, height, width, /*wide=*/false, /*identity=*/true, /*invert=*/false);
    case AutoAugmentPolicy::kAutoAugmentImageNet:
      return space(10, height, width, /*wide=*/false, /*identity=*/false, /*invert=*/true);
    case AutoAugmentPolicy::kNone:
      break;
  }
  return {};
}

bool random_erasing_rect(int height, int width, std::mt19937_64& rng, EraseRect* rect) {
  const double area = double(height) * width;
  const double log_min = std::log(0.3), log_max = std::log(3.3);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double erase_area = area * (0.02 + (0.33 - 0.02) * uniform01(rng));
    const double ratio = std::exp(log_min + (log_max - log_min) * uniform01(rng));
    // Python's round(): half to even, as nearbyint in the default rounding mode.
    const int h = static_cast<int>(std::nearbyint(std::sqrt(erase_area * ratio)));
    const int w = static_cast<int>(std::nearbyint(std::sqrt(erase_area / ratio)));
    if (!(h < height && w < width)) continue;
    rect->height = h;
    rect->width = w;
    rect->top = draw_index(rng, size_t(height - h + 1));
    rect->left = draw_index(rng, size_t(width - w + 1));
    return true;
  }
  return false;
}

void apply_augment_policy(const AugmentPolicyOptions& options, uint8_t* rgb, int height, int width,
                          std::mt19937_64& rng) {
  switch (options.policy) {
    case AutoAugmentPolicy::kNone:
      break;
    case AutoAugmentPolicy::kTrivialAugmentWide: {
      const std::vector<OpMagnitudes> ops = augmentation_space(options.policy, height, width);
      const OpMagnitudes& entry = ops[draw_index(rng, ops.size())];
      const int bin = entry.bins.empty() ? 0 : draw_index(rng, entry.bins.size());
      apply_augment_op(entry.op, signed_magnitude(entry, bin, rng), rgb, height, width,
                       options.interpolation);
      break;
    }
    case AutoAugmentPolicy::kRandAugment: {
      const std::vector<OpMagnitudes> ops = augmentation_space(options.policy, height, width);
      for (int i = 0; i < options.randaugment_num_ops; ++i) {
        const OpMagnitudes& entry = ops[draw_index(rng, ops.size())];
        const double magnitude = signed_magnitude(entry, options.randaugment_magnitude, rng);
        apply_augment_op(entry.op, magnitude, rgb, height, width, options.interpolation);
      }
      break;
    }
    case AutoAugmentPolicy::kAutoAugmentImageNet:
      auto_augment_imagenet(rgb, height, width, options.interpolation, rng);
      break;
  }
  // torchvision's RandomErasing: `if torch.rand(1) < p`, after Normalize with value 0. Erasing
  // the uint8 crop with the mean colour instead gives, after Normalize, (124 / 255 - 0.485) /
  // 0.229 = 0.006 (R), -0.005 (G), 0.008 (B): zero within half a uint8 step (0.5 / 255 / std,
  // about 0.0087).
  EraseRect rect;
  if (options.random_erasing > 0 && uniform01(rng) < options.random_erasing &&
      random_erasing_rect(height, width, rng, &rect))
    fill_rectangle(rgb, height, width, rect.top, rect.left, rect.height, rect.width,
                   kErasingColour);
}

}  // namespace trainer
