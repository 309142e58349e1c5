#include "data/transforms/device_input.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "data/transforms/normalize_kernel.h"

namespace trainer {
namespace {

NormalizeOutput kernel_output_type(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return NormalizeOutput::kFloat;
    case at::kHalf:
      return NormalizeOutput::kHalf;
    case at::kBFloat16:
      return NormalizeOutput::kBFloat16;
    default:
      TORCH_CHECK(false, "normalize_images: unsupported output dtype ", dtype);
  }
}

}  // namespace

at::Tensor normalize_images(const at::Tensor& images, at::ScalarType dtype,
                            c10::MemoryFormat memory_format, const Normalization& norm) {
  TORCH_CHECK(images.dim() == 4 && images.size(3) == 3 && images.scalar_type() == at::kByte,
              "normalize_images expects (N, H, W, 3) uint8, got ", images.sizes(), " ",
              images.scalar_type());
  std::array<float, 3> scale, shift;
  for (int c = 0; c < 3; ++c) {
    scale[c] = 1.0f / (255.0f * norm.std[c]);
    shift[c] = -norm.mean[c] / norm.std[c];
  }
  at::Tensor nhwc;
  if (images.is_cuda()) {
    at::Tensor in = images.contiguous();
    nhwc = at::empty(in.sizes(), in.options().dtype(dtype));
    c10::cuda::CUDAGuard guard(in.device());
    launch_normalize_nhwc(in.data_ptr<uint8_t>(), nhwc.data_ptr(), kernel_output_type(dtype),
                          in.numel() / 3, scale, shift, c10::cuda::getCurrentCUDAStream().stream());
  } else {
    auto opts = at::TensorOptions().dtype(at::kFloat);
    nhwc = (images.to(at::kFloat) * at::tensor(scale, opts) + at::tensor(shift, opts)).to(dtype);
  }
  return nhwc.permute({0, 3, 1, 2}).contiguous(memory_format);  // (N, 3, H, W)
}

}  // namespace trainer
