// MixUp and CutMix on a training batch on the device, as torchvision.transforms.v2.MixUp and
// CutMix do it: each image is mixed with the batch's previous one (the batch rolled by one), and
// the targets become the same mixture of one-hot labels. With both on, each batch takes one of
// the two with equal probability (torchvision's RandomChoice). The draws are host scalars from a
// seed per batch, so nothing waits for the device and a resumed run draws the same again.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>

namespace trainer {

struct MixingOptions {
  double mixup_alpha = 0;   // MixUp's weight of the image itself ~ Beta(alpha, alpha); 0: off
  double cutmix_alpha = 0;  // CutMix's area kept ~ Beta(alpha, alpha); 0: off
  bool enabled() const { return mixup_alpha > 0 || cutmix_alpha > 0; }
};

enum class MixKind { kNone, kMixUp, kCutMix };

// One batch's draw. `lam` is the weight of each image's own label: MixUp's Beta draw, CutMix's
// area left outside the box. The box is [x1, x2) x [y1, y2) in pixels.
struct MixDraw {
  MixKind kind = MixKind::kNone;
  double lam = 1.0;
  int64_t x1 = 0, y1 = 0, x2 = 0, y2 = 0;
};

// The draw for a batch of `height` x `width` images, a function of `seed` alone. CutMix's box is
// torchvision's: a centre uniform over the pixels, half-sides 0.5 sqrt(1 - lam) of each side
// (truncated), clipped to the image, and lam recomputed from the clipped area.
MixDraw draw_mix(const MixingOptions& options, uint64_t seed, int64_t height, int64_t width);

// images (N, C, H, W), any dtype and memory format; targets (N, K) float probabilities. Returns
// the mixed images and targets (new tensors; the inputs are left as they are).
std::pair<at::Tensor, at::Tensor> apply_mix(const MixDraw& draw, const at::Tensor& images,
                                            const at::Tensor& targets);

}  // namespace trainer
