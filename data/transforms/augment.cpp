#include "data/transforms/augment.h"

#include <algorithm>
#include <cmath>
#include <opencv2/core.hpp>

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
                     uint8_t* out, std::string* error) {
  const int s = options.image_size;
  if (!options.training) {
    auto centre = [&](ImageSize size) { return centre_crop_region(size, options.val_resize, s); };
    return decode_crop_resize(encoded, centre, s, s, out, error);
  }
  std::mt19937_64 rng(seed);
  bool flip = false;
  auto random_crop = [&](ImageSize size) {  // crop first, then flip: the seed's fixed order
    const CropRect crop = random_resized_crop(size, rng, options.crop);
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
