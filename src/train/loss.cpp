#include "src/train/loss.h"

#include <ATen/ATen.h>

namespace trainer {

at::Tensor one_hot_targets(const at::Tensor& labels, int64_t num_classes) {
  return at::one_hot(labels, num_classes).to(at::kFloat);
}

at::Tensor training_loss(const at::Tensor& logits, const at::Tensor& targets,
                         const LossOptions& options) {
  const double s = options.label_smoothing;
  if (options.kind ==
      LossKind::kCrossEntropy)  // takes indices or probabilities, and smooths either
    return at::cross_entropy_loss(logits, targets, /*weight=*/{}, at::Reduction::Mean,
                                  /*ignore_index=*/-100, s);
  const int64_t classes = logits.size(1);
  at::Tensor soft = targets.dim() == 1 ? one_hot_targets(targets, classes) : targets;
  if (s > 0) soft = soft.mul(1.0 - s).add_(s / static_cast<double>(classes));
  return at::binary_cross_entropy_with_logits(logits, soft, /*weight=*/{}, /*pos_weight=*/{},
                                              at::Reduction::Mean);
}

}  // namespace trainer
