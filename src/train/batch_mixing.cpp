#include "src/train/batch_mixing.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <random>

namespace trainer {
namespace {

// Beta(alpha, alpha) as X / (X + Y) with X, Y ~ Gamma(alpha, 1).
double sample_beta(double alpha, std::mt19937_64& rng) {
  std::gamma_distribution<double> gamma(alpha, 1.0);
  const double x = gamma(rng), y = gamma(rng);
  return x + y > 0 ? x / (x + y) : 0.5;
}

MixDraw draw_cutmix(double alpha, std::mt19937_64& rng, int64_t height, int64_t width) {
  MixDraw draw;
  draw.kind = MixKind::kCutMix;
  const double lam = sample_beta(alpha, rng);
  const int64_t centre_x = static_cast<int64_t>(rng() % uint64_t(width));
  const int64_t centre_y = static_cast<int64_t>(rng() % uint64_t(height));
  const double r = 0.5 * std::sqrt(1.0 - lam);
  const auto half_w = static_cast<int64_t>(r * width), half_h = static_cast<int64_t>(r * height);
  draw.x1 = std::max<int64_t>(centre_x - half_w, 0);
  draw.y1 = std::max<int64_t>(centre_y - half_h, 0);
  draw.x2 = std::min(centre_x + half_w, width);
  draw.y2 = std::min(centre_y + half_h, height);
  draw.lam = 1.0 - double((draw.x2 - draw.x1) * (draw.y2 - draw.y1)) / double(width * height);
  return draw;
}

}  // namespace

MixDraw draw_mix(const MixingOptions& options, uint64_t seed, int64_t height, int64_t width) {
  if (!options.enabled()) return {};
  std::mt19937_64 rng(seed);
  bool cutmix = options.cutmix_alpha > 0;
  if (options.mixup_alpha > 0 && options.cutmix_alpha > 0) cutmix = (rng() >> 63) != 0;
  if (cutmix) return draw_cutmix(options.cutmix_alpha, rng, height, width);
  MixDraw draw;
  draw.kind = MixKind::kMixUp;
  draw.lam = sample_beta(options.mixup_alpha, rng);
  return draw;
}

std::pair<at::Tensor, at::Tensor> apply_mix(const MixDraw& draw, const at::Tensor& images,
                                            const at::Tensor& targets) {
  if (draw.kind == MixKind::kNone) return {images, targets};
  // Image i is mixed with image i - 1 (the first with the last), as torchvision's roll(1, 0).
  const at::Tensor rolled_images = images.roll(1, 0);
  const at::Tensor mixed_targets = targets.mul(draw.lam).add_(targets.roll(1, 0), 1.0 - draw.lam);
  if (draw.kind == MixKind::kMixUp)
    return {images.mul(draw.lam).add_(rolled_images, 1.0 - draw.lam), mixed_targets};
  at::Tensor mixed_images = images.clone();    // keeps the memory format (channels_last)
  const auto box = [&](const at::Tensor& t) {  // (N, C, y2 - y1, x2 - x1) view
    return t.narrow(2, draw.y1, draw.y2 - draw.y1).narrow(3, draw.x1, draw.x2 - draw.x1);
  };
  box(mixed_images).copy_(box(rolled_images));
  return {mixed_images, mixed_targets};
}

}  // namespace trainer
