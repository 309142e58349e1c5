// A picture of a batch as the model sees it, for TensorBoard: the first images of the network's
// input (normalised, N x 3 x H x W, any dtype or device) turned back into RGB, each with its label
// written in a corner, tiled into a grid and PNG-encoded. A wrong colour order, a bad crop or a
// label mix-up shows at a glance.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "data/transforms/device_input.h"

namespace trainer {

struct Picture {
  std::string png;
  int height = 0;
  int width = 0;
};

// `input`: (N, 3, H, W) as normalised by `norm`; `labels`: (N) int64, any device. Tiles the first
// `count` images (or all, when fewer) `columns` to a row.
Picture preview_grid(const at::Tensor& input, const at::Tensor& labels, int64_t count,
                     int64_t columns, const Normalization& norm = {});

}  // namespace trainer
