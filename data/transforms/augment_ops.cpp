#include "data/transforms/augment_ops.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>
#include <vector>

namespace trainer {
namespace {

constexpr double kPi = 3.14159265358979323846;

// The loops with fused multiply-adds are compiled twice, for CPUs with the FMA instruction and
// without (where std::fma is a library call, several times slower); the loader picks one. Both
// round once, so both give the same pixels. Not under ThreadSanitizer: the loader runs the
// clones' resolver before the sanitizer's run time is up, and the instrumented resolver crashes.
#if defined(__SANITIZE_THREAD__)
#define TRAINER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TRAINER_TSAN 1
#endif
#endif
#if defined(__x86_64__) && defined(__GNUC__) && !defined(TRAINER_TSAN)
#define FMA_CLONES __attribute__((target_clones("fma", "default")))
#else
#define FMA_CLONES
#endif

// Note [Float32 as torchvision]: torchvision's uint8 kernels promote to float32 (a Python float
// factor becomes a float32 scalar), and `a.add_(b, alpha=k)` runs as one fused multiply-add
// (ATen's vectorised add is vec::fmadd); `.to(torch.uint8)` after clamp_(0, 255) truncates. The
// colour ops below repeat that arithmetic step for step, so their results are equal, not close.
inline uint8_t to_uint8(float value) {
  return static_cast<uint8_t>(std::clamp(value, 0.0f, 255.0f));
}

// torchvision's _rgb_to_grayscale_image, then floor_(): r * 0.2989 + 0.587 g + 0.114 b.
inline float grayscale(const uint8_t* p) {
  const float luma = std::fma(float(p[1]), 0.587f, float(p[0]) * 0.2989f);
  return std::floor(std::fma(float(p[2]), 0.114f, luma));
}

// _blend(image1, image2, ratio): image1 * ratio + image2 * (1 - ratio), See Note [Float32 as
// torchvision].
inline uint8_t blend(uint8_t pixel, float other, float ratio, float one_minus_ratio) {
  return to_uint8(std::fma(other, one_minus_ratio, float(pixel) * ratio));
}

// The ops whose output value depends on the input value alone run through a table of 256, filled
// with the same float32 arithmetic: the same pixels, at a table look-up each.
using Lut = std::array<uint8_t, 256>;

void apply_lut(uint8_t* rgb, size_t values, const Lut& lut) {
  for (size_t i = 0; i < values; ++i) rgb[i] = lut[rgb[i]];
}

void brightness(uint8_t* rgb, size_t values, double factor) {
  const float f = static_cast<float>(factor);
  Lut lut;
  for (int v = 0; v < 256; ++v) lut[v] = to_uint8(float(v) * f);
  apply_lut(rgb, values, lut);
}

FMA_CLONES void saturation(uint8_t* rgb, size_t pixels, double factor) {
  const float ratio = static_cast<float>(factor), rest = static_cast<float>(1.0 - factor);
  for (size_t i = 0; i < pixels; ++i) {
    uint8_t* p = rgb + 3 * i;
    const float gray = grayscale(p);
    for (int c = 0; c < 3; ++c) p[c] = blend(p[c], gray, ratio, rest);
  }
}

FMA_CLONES void contrast(uint8_t* rgb, size_t pixels, double factor) {
  // The floored grays are integers: their sum is exact (in float32 as in torch's sum, up to 2^24,
  // i.e. 256x256 white pixels), and the mean is one float32 division as torch's sum().div_(n).
  double sum = 0;
  for (size_t i = 0; i < pixels; ++i) sum += grayscale(rgb + 3 * i);
  const float mean = static_cast<float>(sum) / static_cast<float>(pixels);
  const float ratio = static_cast<float>(factor), rest = static_cast<float>(1.0 - factor);
  Lut lut;
  for (int v = 0; v < 256; ++v) lut[v] = blend(uint8_t(v), mean, ratio, rest);
  apply_lut(rgb, 3 * pixels, lut);
}

// adjust_sharpness: blend with the 3x3 smoothing kernel (1 around, 5 in the middle, / 13) rounded
// to integers; the one-pixel border is kept. The kernel's sum over 13 is never a tie (an integer
// over 13 is never k + 1/2), so float32 round-off in torch's conv2d cannot change the rounding.
FMA_CLONES void sharpness(uint8_t* rgb, int height, int width, double factor) {
  if (height <= 2 || width <= 2) return;
  const std::vector<uint8_t> source(rgb, rgb + size_t(3) * height * width);
  const float alpha = static_cast<float>(1.0 - factor);
  const int stride = 3 * width;
  for (int y = 1; y < height - 1; ++y)
    for (int x = 1; x < width - 1; ++x)
      for (int c = 0; c < 3; ++c) {
        const uint8_t* s = source.data() + y * stride + 3 * x + c;
        const int sum = s[-stride - 3] + s[-stride] + s[-stride + 3] + s[-3] + 5 * s[0] + s[3] +
                        s[stride - 3] + s[stride] + s[stride + 3];
        const int blurred = (2 * sum + 13) / 26;  // round(sum / 13)
        rgb[y * stride + 3 * x + c] = to_uint8(std::fma(float(blurred - s[0]), alpha, float(s[0])));
      }
}

void posterize(uint8_t* rgb, size_t values, double magnitude) {
  // Python's int() truncates; clamped first, as a double, so any magnitude converts.
  const int bits = static_cast<int>(std::fmin(std::fmax(magnitude, 0.0), 8.0));
  if (bits == 8) return;
  const uint8_t mask = static_cast<uint8_t>(((1 << bits) - 1) << (8 - bits));
  for (size_t i = 0; i < values; ++i) rgb[i] &= mask;
}

void solarize(uint8_t* rgb, size_t values, double magnitude) {
  // threshold = 255 * magnitude; `image >= threshold` compares in float32.
  const float threshold = static_cast<float>(255.0 * magnitude);
  Lut lut;
  for (int v = 0; v < 256; ++v) lut[v] = float(v) >= threshold ? uint8_t(255 - v) : uint8_t(v);
  apply_lut(rgb, values, lut);
}

void autocontrast(uint8_t* rgb, size_t pixels) {
  for (int c = 0; c < 3; ++c) {
    uint8_t low = 255, high = 0;
    for (size_t i = 0; i < pixels; ++i) {
      low = std::min(low, rgb[3 * i + c]);
      high = std::max(high, rgb[3 * i + c]);
    }
    if (low == high) continue;  // torchvision: minimum 0, scale 1, i.e. unchanged
    const float inv_scale = float(high - low) * static_cast<float>(1.0 / 255.0);
    Lut lut;
    for (int v = 0; v < 256; ++v) lut[v] = to_uint8(float(v - low) / inv_scale);
    for (size_t i = 0; i < pixels; ++i) rgb[3 * i + c] = lut[rgb[3 * i + c]];
  }
}

// equalize_image: PIL's scheme in integers. lut[k] = (cum_hist[k - 1] + step / 2) / step with
// step = (pixels - count of the largest value present) / 255; a channel with step 0 is kept.
void equalize(uint8_t* rgb, size_t pixels) {
  for (int c = 0; c < 3; ++c) {
    std::array<int64_t, 256> hist{};
    for (size_t i = 0; i < pixels; ++i) ++hist[rgb[3 * i + c]];
    int last = 255;
    while (last > 0 && hist[last] == 0) --last;
    const int64_t step = (int64_t(pixels) - hist[last]) / 255;
    if (step == 0) continue;
    std::array<uint8_t, 256> lut{};
    int64_t cumulative = 0;
    for (int k = 1; k < 256; ++k) {
      cumulative += hist[k - 1];
      lut[k] = static_cast<uint8_t>(std::min<int64_t>((cumulative + step / 2) / step, 255));
    }
    for (size_t i = 0; i < pixels; ++i) rgb[3 * i + c] = lut[rgb[3 * i + c]];
  }
}

// torchvision.transforms.functional._get_inverse_affine_matrix with scale 1, in the frame whose
// origin is the image centre: output (x, y) samples the source at matrix * (x, y, 1).
std::array<double, 6> inverse_affine(double cx, double cy, double angle, double tx, double ty,
                                     double shear_x, double shear_y) {
  const double rot = angle * (kPi / 180), sx = shear_x * (kPi / 180), sy = shear_y * (kPi / 180);
  const double a = std::cos(rot - sy) / std::cos(sy);
  const double b = -std::cos(rot - sy) * std::tan(sx) / std::cos(sy) - std::sin(rot);
  const double c = std::sin(rot - sy) / std::cos(sy);
  const double d = -std::sin(rot - sy) * std::tan(sx) / std::cos(sy) + std::cos(rot);
  std::array<double, 6> m = {d, -b, 0.0, -c, a, 0.0};
  m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty) + cx;
  m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty) + cy;
  return m;
}

// Rounds half to even as std::nearbyint in the default rounding mode, inline: adding and removing
// 1.5 * 2^23 leaves no fraction bits. Exact for |v| < 2^22 (a source coordinate, pixels).
inline float round_half_even(float v) {
  constexpr float kShift = 12582912.0f;  // 1.5 * 2^23
  return (v + kShift) - kShift;
}

// The source point of each output pixel for the centred-frame inverse matrix `m`, in torch's
// float32 steps (affine_image, _affine_grid, grid_sample with align_corners=False):
// theta = float(m) / (w/2, h/2); at the pixel centre (x, y) = (j - (w-1)/2, i - (h-1)/2) the
// normalised source is (x t00 + y t01) + t02, unnormalised to ((g + 1) w - 1) / 2. The order and
// the separate roundings decide the pixels whose source lies on a half (a shear of 0.6 about the
// corner puts a fifth of the rows there), so this file is compiled without contracting a * b + c
// into one fused operation (data/CMakeLists.txt).
class SourcePoints {
 public:
  SourcePoints(int height, int width, const std::array<double, 6>& m)
      : height_(height), width_(width) {
    const float half_w = 0.5f * float(width), half_h = 0.5f * float(height);
    t00_ = float(m[0]) / half_w, t01_ = float(m[1]) / half_w, t02_ = float(m[2]) / half_w;
    t10_ = float(m[3]) / half_h, t11_ = float(m[4]) / half_h, t12_ = float(m[5]) / half_h;
  }
  // The source (x, y) of output pixel (i, j), in source pixels.
  std::pair<float, float> at(int i, int j) const {
    const float y = float(i) - 0.5f * float(height_ - 1);
    const float x = float(j) - 0.5f * float(width_ - 1);
    const float gx = (x * t00_ + y * t01_) + t02_, gy = (x * t10_ + y * t11_) + t12_;
    return {((gx + 1.0f) * float(width_) - 1.0f) / 2.0f,
            ((gy + 1.0f) * float(height_) - 1.0f) / 2.0f};
  }

 private:
  int height_, width_;
  float t00_, t01_, t02_, t10_, t11_, t12_;
};

// Nearest, outside filled with 0: the source point rounded half to even, as grid_sample does.
// cv::warpAffine rounds half up in 1/1024-pixel fixed point instead: 7-8% of the pixels off on a
// shear of 0.6.
void warp_nearest(uint8_t* rgb, int height, int width, const std::array<double, 6>& m) {
  const SourcePoints points(height, width, m);
  const std::vector<uint8_t> source(rgb, rgb + size_t(3) * height * width);
  std::vector<int> from(width);  // a row's source pixel indices; -1: outside
  for (int i = 0; i < height; ++i) {
    for (int j = 0; j < width; ++j) {  // branch-free, so that it vectorises
      const auto [px, py] = points.at(i, j);
      const float sx = round_half_even(px), sy = round_half_even(py);
      const bool inside = (sx >= 0) & (sx < float(width)) & (sy >= 0) & (sy < float(height));
      // Clamped before the conversion: a point far outside (a large shear) does not fit an int.
      const int index = int(std::fmin(std::fmax(sy, 0.0f), float(height - 1))) * width +
                        int(std::fmin(std::fmax(sx, 0.0f), float(width - 1)));
      from[j] = inside ? index : -1;
    }
    uint8_t* out = rgb + size_t(i) * width * 3;
    for (int j = 0; j < width; ++j, out += 3) {
      if (from[j] < 0) {
        out[0] = out[1] = out[2] = 0;  // fill 0
        continue;
      }
      const uint8_t* in = source.data() + size_t(from[j]) * 3;
      out[0] = in[0], out[1] = in[1], out[2] = in[2];
    }
  }
}

// Bilinear, as grid_sample's CPU kernel computes it in float32 at the same source points: the
// four neighbours, those outside read as 0 (zeros padding), weighted by the distances to the
// opposite sides and summed north-west, north-east, south-west, south-east in that order, then
// rounded half to even (torchvision's round_ before the cast back to uint8).
void warp_bilinear(uint8_t* rgb, int height, int width, const std::array<double, 6>& m) {
  const SourcePoints points(height, width, m);
  const std::vector<uint8_t> source(rgb, rgb + size_t(3) * height * width);
  const auto pixel = [&](int y, int x) -> const uint8_t* {  // nullptr: outside
    const bool inside = x >= 0 && x < width && y >= 0 && y < height;
    return inside ? source.data() + (size_t(y) * width + x) * 3 : nullptr;
  };
  for (int i = 0; i < height; ++i) {
    uint8_t* out = rgb + size_t(i) * width * 3;
    for (int j = 0; j < width; ++j, out += 3) {
      const auto [ix, iy] = points.at(i, j);
      const float x_w = std::floor(ix), y_n = std::floor(iy);
      // All four neighbours outside (or the point past an int, from a large shear): zeros padding.
      if (!(x_w >= -1.0f && x_w < float(width) && y_n >= -1.0f && y_n < float(height))) {
        out[0] = out[1] = out[2] = 0;
        continue;
      }
      const float w = ix - x_w, e = 1.0f - w, n = iy - y_n, s = 1.0f - n;
      const float weights[4] = {s * e, s * w, n * e, n * w};  // nw, ne, sw, se
      const int x0 = int(x_w), y0 = int(y_n);
      const uint8_t* corners[4] = {pixel(y0, x0), pixel(y0, x0 + 1), pixel(y0 + 1, x0),
                                   pixel(y0 + 1, x0 + 1)};
      for (int c = 0; c < 3; ++c) {
        float sum = 0.0f;
        for (int k = 0; k < 4; ++k)
          sum = sum + (corners[k] ? float(corners[k][c]) : 0.0f) * weights[k];
        out[c] = static_cast<uint8_t>(round_half_even(sum));
      }
    }
  }
}

void affine(AugmentOp op, double magnitude, uint8_t* rgb, int height, int width,
            Interpolation interpolation) {
  const auto warp = [&](uint8_t* image, int h, int w, const std::array<double, 6>& m) {
    if (interpolation == Interpolation::kBilinear) return warp_bilinear(image, h, w, m);
    return warp_nearest(image, h, w, m);
  };
  // Shears are about the top-left corner (torchvision's center=[0, 0]), i.e. (-w/2, -h/2) in the
  // centred frame; translations and rotations about the centre.
  const double corner_x = -width * 0.5, corner_y = -height * 0.5;
  const double shear_degrees = std::atan(magnitude) * (180 / kPi);
  switch (op) {
    case AugmentOp::kShearX:
      return warp(rgb, height, width,
                  inverse_affine(corner_x, corner_y, 0, 0, 0, shear_degrees, 0));
    case AugmentOp::kShearY:
      return warp(rgb, height, width,
                  inverse_affine(corner_x, corner_y, 0, 0, 0, 0, shear_degrees));
    case AugmentOp::kTranslateX:
      return warp(rgb, height, width, inverse_affine(0, 0, 0, std::trunc(magnitude), 0, 0, 0));
    case AugmentOp::kTranslateY:
      return warp(rgb, height, width, inverse_affine(0, 0, 0, 0, std::trunc(magnitude), 0, 0));
    case AugmentOp::kRotate: {
      const double angle = magnitude - 360 * std::floor(magnitude / 360);  // Python's % 360
      if (angle == 0) return;
      return warp(rgb, height, width, inverse_affine(0, 0, -angle, 0, 0, 0, 0));
    }
    default:
      return;
  }
}

constexpr std::array<const char*, 15> kOpNames = {
    "Identity",  "ShearX",     "ShearY",       "TranslateX", "TranslateY",
    "Rotate",    "Brightness", "Color",        "Contrast",   "Sharpness",
    "Posterize", "Solarize",   "AutoContrast", "Equalize",   "Invert"};

}  // namespace

const char* op_name(AugmentOp op) { return kOpNames[static_cast<size_t>(op)]; }

bool op_from_name(std::string_view name, AugmentOp* op) {
  for (size_t i = 0; i < kOpNames.size(); ++i)
    if (name == kOpNames[i]) {
      *op = static_cast<AugmentOp>(i);
      return true;
    }
  return false;
}

void apply_augment_op(AugmentOp op, double magnitude, uint8_t* rgb, int height, int width,
                      Interpolation interpolation) {
  const size_t pixels = size_t(height) * width, values = 3 * pixels;
  switch (op) {
    case AugmentOp::kIdentity:
      return;
    case AugmentOp::kShearX:
    case AugmentOp::kShearY:
    case AugmentOp::kTranslateX:
    case AugmentOp::kTranslateY:
    case AugmentOp::kRotate:
      return affine(op, magnitude, rgb, height, width, interpolation);
    case AugmentOp::kBrightness:
      return brightness(rgb, values, 1.0 + magnitude);
    case AugmentOp::kColor:
      return saturation(rgb, pixels, 1.0 + magnitude);
    case AugmentOp::kContrast:
      return contrast(rgb, pixels, 1.0 + magnitude);
    case AugmentOp::kSharpness:
      return sharpness(rgb, height, width, 1.0 + magnitude);
    case AugmentOp::kPosterize:
      return posterize(rgb, values, magnitude);
    case AugmentOp::kSolarize:
      return solarize(rgb, values, magnitude);
    case AugmentOp::kAutoContrast:
      return autocontrast(rgb, pixels);
    case AugmentOp::kEqualize:
      return equalize(rgb, pixels);
    case AugmentOp::kInvert:
      for (size_t i = 0; i < values; ++i) rgb[i] = 255 - rgb[i];
      return;
  }
}

void fill_rectangle(uint8_t* rgb, int height, int width, int top, int left, int h, int w,
                    const uint8_t colour[3]) {
  for (int y = std::max(top, 0); y < std::min(top + h, height); ++y)
    for (int x = std::max(left, 0); x < std::min(left + w, width); ++x)
      for (int c = 0; c < 3; ++c) rgb[(size_t(y) * width + x) * 3 + c] = colour[c];
}

}  // namespace trainer
