#include "models/cuda/max_pool.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/autograd.h>

#include "base/user_error.h"
#include "models/cuda/max_pool_kernel.h"

namespace trainer {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

max_pool::Element element(const at::Tensor& x) {
  switch (x.scalar_type()) {
    case at::kHalf:
      return max_pool::Element::kHalf;
    case at::kBFloat16:
      return max_pool::Element::kBFloat16;
    default:
      return max_pool::Element::kFloat;
  }
}

// The window over an input of these sizes, in int (compact_max_pool2d checks that the products
// fit too).
max_pool::Geometry geometry(at::IntArrayRef input_sizes, int64_t kernel, int64_t stride,
                            int64_t padding) {
  auto narrow = [](int64_t v) { return static_cast<int>(v); };
  return max_pool::make_geometry(narrow(input_sizes[0]), narrow(input_sizes[1]),
                                 narrow(input_sizes[2]), narrow(input_sizes[3]), narrow(kernel),
                                 narrow(stride), narrow(padding));
}

int64_t output_values(const max_pool::Geometry& g) {
  return int64_t{g.batch} * g.channels * g.out_height * g.out_width;
}

at::Tensor channels_last(at::IntArrayRef sizes, const at::TensorOptions& options) {
  return at::empty(sizes, options.memory_format(at::MemoryFormat::ChannelsLast));
}

void* current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

class CompactMaxPool : public torch::autograd::Function<CompactMaxPool> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t kernel,
                            int64_t stride, int64_t padding) {
    c10::cuda::CUDAGuard device(x.device());
    const max_pool::Geometry g = geometry(x.sizes(), kernel, stride, padding);
    const std::vector<int64_t> out_sizes = {g.batch, g.channels, g.out_height, g.out_width};
    at::Tensor y = channels_last(out_sizes, x.options());
    at::Tensor place = channels_last(out_sizes, x.options().dtype(at::kByte));
    max_pool::launch_forward(x.data_ptr(), y.data_ptr(), place.data_ptr<uint8_t>(), element(x), g,
                             current_stream());
    ctx->save_for_backward({place});
    ctx->saved_data["input_sizes"] = x.sizes().vec();
    ctx->saved_data["window"] = std::vector<int64_t>{kernel, stride, padding};
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const at::Tensor place = ctx->get_saved_variables()[0];
    const std::vector<int64_t> input_sizes = ctx->saved_data["input_sizes"].toIntVector();
    const std::vector<int64_t> window = ctx->saved_data["window"].toIntVector();
    c10::cuda::CUDAGuard device(place.device());
    const at::Tensor dy = grads[0].contiguous(at::MemoryFormat::ChannelsLast);
    at::Tensor dx = channels_last(input_sizes, dy.options());
    const max_pool::Geometry g = geometry(input_sizes, window[0], window[1], window[2]);
    max_pool::launch_backward(dy.data_ptr(), place.data_ptr<uint8_t>(), dx.data_ptr(), element(dy),
                              g, current_stream());
    return {dx, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool compact_max_pool_applies(const at::Tensor& x) {
  const auto dtype = x.scalar_type();
  return x.is_cuda() && x.dim() == 4 && x.is_contiguous(at::MemoryFormat::ChannelsLast) &&
         (dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16);
}

at::Tensor compact_max_pool2d(const at::Tensor& x, int kernel, int stride, int padding) {
  TORCH_INTERNAL_ASSERT(compact_max_pool_applies(x), "compact_max_pool2d: ", x.sizes(), " ",
                        x.strides(), " ", x.dtype(), " ", x.device());
  USER_CHECK(kernel >= 1 && kernel <= max_pool::kMaxKernel && stride >= 1 && padding >= 0 &&
                 2 * padding <= kernel,
             "max pooling window ", kernel, " stride ", stride, " padding ", padding,
             ": the kernel must be 1-", max_pool::kMaxKernel,
             " and the padding at most half of it");
  const max_pool::Geometry g = geometry(x.sizes(), kernel, stride, padding);
  USER_CHECK(g.out_height >= 1 && g.out_width >= 1, "max pooling window ", kernel, " padding ",
             padding, " does not fit the ", x.size(2), "x", x.size(3),
             " activation: use a larger image_size");
  // The kernels index in 32 bits; a larger activation (over a billion values) keeps ATen's.
  if (x.numel() > max_pool::kMaxValues || output_values(g) > max_pool::kMaxValues)
    return at::max_pool2d(x, kernel, stride, padding);
  return CompactMaxPool::apply(x, kernel, stride, padding);
}

}  // namespace trainer
