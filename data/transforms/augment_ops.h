// The image operations of AutoAugment, RandAugment and TrivialAugmentWide on a uint8 RGB crop,
// each as torchvision.transforms.v2.functional computes it on a uint8 tensor (float32 arithmetic,
// truncation to uint8; nearest or bilinear interpolation and fill 0 for the geometric ones), and
// the rectangle fill of random erasing. tests/data/test_augment_parity.py checks them against
// torchvision.
#pragma once

#include <cstdint>
#include <string_view>

namespace trainer {

enum class AugmentOp {
  kIdentity,
  kShearX,  // magnitude: shear factor (tan of the angle), around the top-left corner
  kShearY,
  kTranslateX,  // magnitude: pixels, truncated toward zero as torchvision's int()
  kTranslateY,
  kRotate,      // magnitude: degrees, counter-clockwise, around the centre
  kBrightness,  // magnitude m: factor 1 + m
  kColor,       // saturation factor 1 + m
  kContrast,    // factor 1 + m
  kSharpness,   // factor 1 + m
  kPosterize,   // magnitude: bits kept, truncated to an integer in [0, 8]
  kSolarize,    // magnitude: threshold as a fraction of 255 (torchvision 0.26's v2 convention)
  kAutoContrast,
  kEqualize,
  kInvert,
};

// How the geometric ops sample the source: torchvision's InterpolationMode NEAREST (the policies'
// default) or BILINEAR (what torchvision's classification reference passes, --interpolation).
enum class Interpolation { kNearest, kBilinear };

// "ShearX", "Posterize", ...: torchvision's names. op_from_name returns false for an unknown name.
const char* op_name(AugmentOp op);
bool op_from_name(std::string_view name, AugmentOp* op);

// Applies `op` with `magnitude` in place to `rgb`, (height, width, 3) uint8, rows contiguous.
void apply_augment_op(AugmentOp op, double magnitude, uint8_t* rgb, int height, int width,
                      Interpolation interpolation = Interpolation::kNearest);

// Fills rows [top, top + h) and columns [left, left + w) of `rgb` ((height, width, 3) uint8) with
// `colour` (R, G, B).
void fill_rectangle(uint8_t* rgb, int height, int width, int top, int left, int h, int w,
                    const uint8_t colour[3]);

}  // namespace trainer
