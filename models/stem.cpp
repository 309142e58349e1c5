#include "models/stem.h"

#include <ATen/ATen.h>

#include <vector>

namespace trainer {

at::Tensor padded_stem_conv(const at::Tensor& image, const at::Tensor& weight, int64_t channels) {
  const int64_t added = channels - image.size(1);
  // Pads dimension 1 (channels) at the end; the layouts stay channels_last if they were.
  const std::vector<int64_t> more_channels = {0, 0, 0, 0, 0, added};
  const at::Tensor input =
      at::constant_pad_nd(image, more_channels).contiguous(image.suggest_memory_format());
  const at::Tensor padded_weight =
      at::constant_pad_nd(weight, more_channels).contiguous(weight.suggest_memory_format());
  return at::conv2d(input, padded_weight, /*bias=*/{}, kStemStride, kStemPadding);
}

namespace {

// The plain convolution's output size along a dimension of `size` pixels.
int64_t stem_output_size(int64_t size) {
  return (size + 2 * kStemPadding - kStemKernel) / kStemStride + 1;
}

}  // namespace

at::Tensor space_to_depth_stem_conv(const at::Tensor& image, const at::Tensor& weight) {
  constexpr int64_t kBlock = 2, kBlockKernel = (kStemKernel + 1) / kBlock;  // 4
  // Output pixel o reads blocks o .. o+3 of the padded image: 2 (size_out + 3) pixels, of which
  // the plain convolution's 3 on the left and the rest (3 or 4) on the right are zeros.
  const int64_t height = image.size(2), width = image.size(3);
  const int64_t bottom = kBlock * (stem_output_size(height) + kBlockKernel - 1) - height - 3;
  const int64_t right = kBlock * (stem_output_size(width) + kBlockKernel - 1) - width - 3;
  // pixel_unshuffle puts pixel (2i + a, 2j + b) of channel c in channel 4c + 2a + b: the same
  // order for the image and the weight, so the 16 products of each block pair up.
  const at::Tensor blocks =
      at::pixel_unshuffle(at::constant_pad_nd(image, {3, right, 3, bottom, 0, 4 - image.size(1)}),
                          kBlock)
          .contiguous(image.suggest_memory_format());
  // The weight to 8x8 (its last row and column zero) and 4 channels, then into blocks.
  const at::Tensor block_weight =
      at::pixel_unshuffle(at::constant_pad_nd(weight, {0, 1, 0, 1, 0, 4 - weight.size(1)}), kBlock)
          .contiguous(weight.suggest_memory_format());
  return at::conv2d(blocks, block_weight);  // stride 1, no padding
}

}  // namespace trainer
