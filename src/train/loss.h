// The training loss on (N, K) float logits: softmax cross-entropy, or binary cross-entropy (one
// sigmoid per class, as timm's BinaryCrossEntropy and Composer's recipes use it). Targets are
// class indices (N) int64, or probabilities (N, K) float after MixUp/CutMix. Label smoothing
// mixes the targets with the uniform distribution: t (1 - s) + s / K, for both losses.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace trainer {

enum class LossKind { kCrossEntropy, kBce };

struct LossOptions {
  LossKind kind = LossKind::kCrossEntropy;
  double label_smoothing = 0.0;
};

// The batch's mean loss, a 0-dim float tensor. bce averages over the N x K logits, as
// torch.nn.functional.binary_cross_entropy_with_logits(reduction="mean") does.
at::Tensor training_loss(const at::Tensor& logits, const at::Tensor& targets,
                         const LossOptions& options);

// Class indices (N) as one-hot probabilities (N, num_classes) float.
at::Tensor one_hot_targets(const at::Tensor& labels, int64_t num_classes);

}  // namespace trainer
