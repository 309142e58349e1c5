#include "data/transforms/augment.h"

#include <algorithm>
#include <cmath>
#include <opencv2/core.hpp>
#include <vector>

#include "base/seed.h"

namespace trainer {

CropRect random_resized_crop(ImageSize image, std::mt19937_64& rng,
                             const RandomResizedCropOptions& o) {
  const double area = double(image.width) * image.height;
  const double log_min = std::log(o.min_ratio), log_max = std::log(o.max_ratio);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * (o.min_area + (o.max_area - o.min_area) * uniform01(rng));
    const double ratio = std::exp(log_min + (log_max - log_min) * uniform01(rng));
    const int w = static_cast<int>(std::lround(std::sqrt(target * ratio)));
    const int h = static_cast<int>(std::lround(std::sqrt(target / ratio)));
    if (w > 0 && h > 0 && w <= image.width && h <= image.height) {
      const int y = static_cast<int>(rng() % uint64_t(image.height - h + 1));
      const int x = static_cast<int>(rng() % uint64_t(image.width - w + 1));
      return {x, y, w, h};
    }
  }
  // Fallback: the whole image, cut to the nearest allowed aspect ratio, centred.
  const double in_ratio = double(image.width) / image.height;
  int w = image.width, h = image.height;
  if (in_ratio < o.min_ratio) {
    h = static_cast<int>(std::lround(w / o.min_ratio));
  } else if (in_ratio > o.max_ratio) {
    w = static_cast<int>(std::lround(h * o.max_ratio));
  }
  w = std::clamp(w, 1, image.width);
  h = std::clamp(h, 1, image.height);
  return {(image.width - w) / 2, (image.height - h) / 2, w, h};
}

namespace {

// A rectangle in whole pixels, [x0, x1) x [y0, y1), as TensorFlow's kernel keeps its crops and
// boxes (its Rectangle): an inverted one has a negative area.
struct PixelRect {
  int x0 = 0, y0 = 0, x1 = 0, y1 = 0;
  float area() const { return static_cast<float>((x1 - x0) * (y1 - y0)); }
};

PixelRect intersect(const PixelRect& a, const PixelRect& b) {
  const PixelRect r{std::max(a.x0, b.x0), std::max(a.y0, b.y0), std::min(a.x1, b.x1),
                    std::min(a.y1, b.y1)};
  if (r.x0 > r.x1 || r.y0 > r.y1) return {};
  return r;
}

// TensorFlow's SatisfiesOverlapConstraints: the crop covers at least `min_covered` of the area of
// one box; boxes (and crops) of less than a pixel count for nothing.
bool covers_some_box(const PixelRect& crop, float min_covered,
                     const std::vector<PixelRect>& boxes) {
  constexpr float kMinArea = 1.0f;
  if (crop.area() < kMinArea) return false;
  for (const PixelRect& box : boxes) {
    const float box_area = box.area();
    if (box_area < kMinArea) continue;
    if (intersect(crop, box).area() / box_area >= min_covered) return true;
  }
  return false;
}

// Uniform in [0, n), n > 0.
int uniform_below(std::mt19937_64& rng, int n) { return static_cast<int>(rng() % uint64_t(n)); }

// TensorFlow's GenerateRandomCrop, its float arithmetic and rounding (lrintf) kept: the height is
// uniform between the heights of the smallest and the largest allowed areas at this aspect ratio.
bool generate_random_crop(int W, int H, float min_rel_area, float max_rel_area, float aspect,
                          std::mt19937_64& rng, PixelRect* crop) {
  if (max_rel_area <= 0.0f || aspect <= 0.0f || W <= 0 || H <= 0 || min_rel_area > max_rel_area)
    return false;
  const float min_area = min_rel_area * W * H;
  const float max_area = max_rel_area * W * H;
  int height = static_cast<int>(std::lrint(std::sqrt(min_area / aspect)));
  int max_height = static_cast<int>(std::lrint(std::sqrt(max_area / aspect)));
  if (std::lrint(max_height * aspect) > W) {  // the largest height whose width still fits
    const float kEps = 0.0000001f;
    max_height = static_cast<int>((W + 0.5 - kEps) / aspect);
    if (std::lrint(max_height * aspect) > W) max_height -= 1;
  }
  max_height = std::min(max_height, H);
  if (height >= max_height) height = max_height;
  if (height < max_height) height += uniform_below(rng, max_height - height + 1);
  int width = static_cast<int>(std::lrint(height * aspect));
  // Rounding may leave the area just outside the range: one pixel taller, else one shorter.
  float area = static_cast<float>(width * height);
  if (area < min_area) {
    height += 1;
    width = static_cast<int>(std::lrint(height * aspect));
    area = static_cast<float>(width * height);
  }
  if (area > max_area) {
    height -= 1;
    width = static_cast<int>(std::lrint(height * aspect));
    area = static_cast<float>(width * height);
  }
  if (area < min_area || area > max_area || width > W || height > H || width <= 0 || height <= 0)
    return false;
  const int y = height < H ? uniform_below(rng, H - height) : 0;
  const int x = width < W ? uniform_below(rng, W - width) : 0;
  *crop = {x, y, x + width, y + height};
  return true;
}

}  // namespace

CropRect distorted_bounding_box_crop(ImageSize image, BoxList boxes, std::mt19937_64& rng,
                                     const DistortedBoxOptions& o) {
  const int W = image.width, H = image.height;
  // Corners truncated to pixels, as the kernel converts them; thread-local: no allocation per
  // image once warm.
  thread_local std::vector<PixelRect> rects;
  rects.clear();
  for (size_t i = 0; i < boxes.size; ++i) {
    const NormalisedBox& b = boxes.data[i];  // {xmin, ymin, xmax, ymax}
    auto at = [&](int k, int side) {
      return static_cast<int>(std::clamp(b[k], 0.0f, 1.0f) * side);
    };
    rects.push_back({at(0, W), at(1, H), at(2, W), at(3, H)});
  }
  const PixelRect whole{0, 0, W, H};
  if (rects.empty()) rects.push_back(whole);  // use_image_if_no_bounding_boxes
  for (int attempt = 0; attempt < o.max_attempts; ++attempt) {
    const float aspect =
        static_cast<float>(uniform01(rng)) * (o.max_aspect - o.min_aspect) + o.min_aspect;
    PixelRect crop;
    if (generate_random_crop(W, H, o.min_area, o.max_area, aspect, rng, &crop) &&
        covers_some_box(crop, o.min_object_covered, rects))
      return {crop.x0, crop.y0, crop.x1 - crop.x0, crop.y1 - crop.y0};
  }
  return {0, 0, std::max(W, 1), std::max(H, 1)};
}

CropRect centre_crop_region(ImageSize image, int resize, int crop) {
  // After resizing, the shorter side is `resize`; `crop` of it is kept, i.e. a fraction
  // crop / resize of the shorter side, centred, and a square in the resized image.
  const double scale = double(resize) / std::min(image.width, image.height);
  const int side_w = std::min(image.width, static_cast<int>(std::lround(crop / scale)));
  const int side_h = std::min(image.height, static_cast<int>(std::lround(crop / scale)));
  return {(image.width - side_w) / 2, (image.height - side_h) / 2, std::max(side_w, 1),
          std::max(side_h, 1)};
}

bool transform_image(std::string_view encoded, const TransformOptions& options, uint64_t seed,
                     uint8_t* out, std::string* error, BoxList boxes) {
  const int s = options.image_size;
  if (!options.training) {
    auto centre = [&](ImageSize size) { return centre_crop_region(size, options.val_resize, s); };
    return decode_crop_resize(encoded, centre, s, s, out, error);
  }
  std::mt19937_64 rng(seed);
  bool flip = false;
  auto random_crop = [&](ImageSize size) {  // crop first, then flip: the seed's fixed order
    const CropRect crop = options.train_crop == TrainCrop::kDistortedBoundingBox
                              ? distorted_bounding_box_crop(size, boxes, rng, options.distorted_box)
                              : random_resized_crop(size, rng, options.crop);
    flip = (rng() >> 63) != 0;
    return crop;
  };
  if (!decode_crop_resize(encoded, random_crop, s, s, out, error)) return false;
  if (flip) {
    cv::Mat image(s, s, CV_8UC3, out);
    cv::flip(image, image, 1);  // in place, around the vertical axis
  }
  apply_augment_policy(options.policy, out, s, s, rng);  // See Note [Augmentation draws]
  return true;
}

}  // namespace trainer
