#include "models/cuda/fused_batch_norm.h"

#include <ATen/ATen.h>
#include <ATen/cudnn/Handle.h>
#include <c10/cuda/CUDAGuard.h>
#include <cudnn.h>
#include <spdlog/spdlog.h>
#include <torch/autograd.h>

#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <utility>

#include "base/cudnn_check.h"

// Note [Fused batch norm]
// cuDNN's batch norm "Ex" calls normalise, add the residual and apply the ReLU in one kernel, and
// in backward take the ReLU's and the add's gradients in the same kernel as the BN's. They run
// in NHWC with SPATIAL_PERSISTENT, the mode ATen itself picks for channels_last training. Their
// running statistics are ATen's: the same momentum, the unbiased variance.
//
// Which dtypes cuDNN fuses depends on its version and the GPU, so each dtype is probed once on a
// small tensor, forward and backward (path_for). A dtype with no fusion but cuDNN's plain BN
// (cuDNN's, not ATen's: ATen never uses cuDNN for bf16 and falls back to multi-pass kernels)
// runs that with ATen's add and ReLU; with neither, ATen's ops as the model always ran them.

namespace trainer {
namespace {

constexpr cudnnBatchNormMode_t kMode = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;

cudnnDataType_t cudnn_type(at::ScalarType dtype) {
  return dtype == at::kHalf ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
}

// One (N, C, H, W) NHWC activation's descriptor, its per-channel one, and the ReLU's.
class Descriptors {
 public:
  explicit Descriptors(const at::Tensor& x) {
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&activation_));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&per_channel_));
    CUDNN_CHECK(cudnnCreateActivationDescriptor(&relu_));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(
        activation_, CUDNN_TENSOR_NHWC, cudnn_type(x.scalar_type()), static_cast<int>(x.size(0)),
        static_cast<int>(x.size(1)), static_cast<int>(x.size(2)), static_cast<int>(x.size(3))));
    CUDNN_CHECK(
        cudnnDeriveBNTensorDescriptor(per_channel_, activation_, kMode));  // fp32, (1,C,1,1)
    CUDNN_CHECK(cudnnSetActivationDescriptor(relu_, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0));
  }
  ~Descriptors() {
    cudnnDestroyActivationDescriptor(relu_);
    cudnnDestroyTensorDescriptor(per_channel_);
    cudnnDestroyTensorDescriptor(activation_);
  }
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;

  cudnnTensorDescriptor_t activation() const { return activation_; }
  cudnnTensorDescriptor_t per_channel() const { return per_channel_; }
  // The ReLU for the fused ops; none for plain BN.
  cudnnActivationDescriptor_t relu(cudnnBatchNormOps_t ops) const {
    return ops == CUDNN_BATCHNORM_OPS_BN ? nullptr : relu_;
  }
  // The residual's (and its gradient's) descriptor: only BN+add+ReLU has one.
  cudnnTensorDescriptor_t residual(cudnnBatchNormOps_t ops) const {
    return ops == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION ? activation_ : nullptr;
  }

 private:
  cudnnTensorDescriptor_t activation_ = nullptr;
  cudnnTensorDescriptor_t per_channel_ = nullptr;
  cudnnActivationDescriptor_t relu_ = nullptr;
};

at::Tensor scratch_bytes(size_t bytes, const at::Tensor& like) {
  return at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
}

void* data_or_null(const at::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

struct Forward {
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
  at::Tensor y, save_mean, save_invstd, reserve;
};

// y = ops(bn(x) [+ z]); updates the running statistics. A status other than success leaves
// everything untouched (the probe reads it; the autograd function throws it).
Forward cudnn_forward(const at::Tensor& x, const at::Tensor& z, const at::Tensor& weight,
                      const at::Tensor& bias, const at::Tensor& running_mean,
                      const at::Tensor& running_var, double factor, double eps,
                      cudnnBatchNormOps_t ops) {
  c10::cuda::CUDAGuard device(x.device());
  cudnnHandle_t handle = at::native::getCudnnHandle();  // on the current stream
  const Descriptors d(x);
  Forward out;
  size_t workspace_bytes = 0, reserve_bytes = 0;
  out.status = cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
      handle, kMode, ops, d.activation(), d.residual(ops), d.activation(), d.per_channel(),
      d.relu(ops), &workspace_bytes);
  if (out.status != CUDNN_STATUS_SUCCESS) return out;
  out.status = cudnnGetBatchNormalizationTrainingExReserveSpaceSize(handle, kMode, ops, d.relu(ops),
                                                                    d.activation(), &reserve_bytes);
  if (out.status != CUDNN_STATUS_SUCCESS) return out;
  out.y = at::empty_like(x, at::MemoryFormat::ChannelsLast);
  out.save_mean = at::empty_like(weight);
  out.save_invstd = at::empty_like(weight);
  out.reserve = scratch_bytes(reserve_bytes, x);
  const at::Tensor workspace = scratch_bytes(workspace_bytes, x);
  const float one = 1, zero = 0;
  out.status = cudnnBatchNormalizationForwardTrainingEx(
      handle, kMode, ops, &one, &zero, d.activation(), x.data_ptr(), d.residual(ops),
      data_or_null(z), d.activation(), out.y.data_ptr(), d.per_channel(), weight.data_ptr(),
      bias.data_ptr(), factor, running_mean.data_ptr(), running_var.data_ptr(), eps,
      out.save_mean.data_ptr(), out.save_invstd.data_ptr(), d.relu(ops), workspace.data_ptr(),
      workspace_bytes, out.reserve.data_ptr(), reserve_bytes);
  return out;
}

struct Backward {
  at::Tensor dx, dz, dweight, dbias;  // dz only for BN+add+ReLU
};

// The gradients of cudnn_forward's x, z, weight and bias from y's; y is its output (read for
// the ReLU's mask; undefined for plain BN).
cudnnStatus_t cudnn_backward(const at::Tensor& x, const at::Tensor& y, const at::Tensor& dy,
                             const at::Tensor& weight, const at::Tensor& bias,
                             const at::Tensor& save_mean, const at::Tensor& save_invstd,
                             const at::Tensor& reserve, double eps, cudnnBatchNormOps_t ops,
                             Backward& out) {
  c10::cuda::CUDAGuard device(x.device());
  cudnnHandle_t handle = at::native::getCudnnHandle();
  const Descriptors d(x);
  const cudnnTensorDescriptor_t y_desc = ops == CUDNN_BATCHNORM_OPS_BN ? nullptr : d.activation();
  size_t workspace_bytes = 0;
  cudnnStatus_t status = cudnnGetBatchNormalizationBackwardExWorkspaceSize(
      handle, kMode, ops, d.activation(), y_desc, d.activation(), d.residual(ops), d.activation(),
      d.per_channel(), d.relu(ops), &workspace_bytes);
  if (status != CUDNN_STATUS_SUCCESS) return status;
  const at::Tensor workspace = scratch_bytes(workspace_bytes, x);
  out.dx = at::empty_like(x, at::MemoryFormat::ChannelsLast);
  if (ops == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION)
    out.dz = at::empty_like(x, at::MemoryFormat::ChannelsLast);
  out.dweight = at::empty_like(weight);
  out.dbias = at::empty_like(bias);
  const float one = 1, zero = 0;
  return cudnnBatchNormalizationBackwardEx(
      handle, kMode, ops, &one, &zero, &one, &zero, d.activation(), x.data_ptr(), y_desc,
      data_or_null(y), d.activation(), dy.data_ptr(), d.residual(ops), data_or_null(out.dz),
      d.activation(), out.dx.data_ptr(), d.per_channel(), weight.data_ptr(), bias.data_ptr(),
      out.dweight.data_ptr(), out.dbias.data_ptr(), eps, save_mean.data_ptr(),
      save_invstd.data_ptr(), d.relu(ops), workspace.data_ptr(), workspace_bytes,
      data_or_null(reserve), static_cast<size_t>(reserve.numel()));
}

// cudnn_forward and cudnn_backward as one differentiable op: grads for x, residual, weight, bias.
// Autograd takes only defined tensors, so without a residual (plain BN, BN+ReLU) its slot holds x
// and gets no gradient.
class CudnnBatchNorm : public torch::autograd::Function<CudnnBatchNorm> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor x,
                            at::Tensor residual, at::Tensor weight, at::Tensor bias,
                            at::Tensor running_mean, at::Tensor running_var, double factor,
                            double eps, int64_t ops_code) {
    const auto ops = static_cast<cudnnBatchNormOps_t>(ops_code);
    const at::Tensor z = ops == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION ? residual : at::Tensor();
    Forward f = cudnn_forward(x, z, weight, bias, running_mean, running_var, factor, eps, ops);
    CUDNN_CHECK(f.status);
    // y is read back only for the ReLU's mask; plain BN's output stays free for in-place ops.
    ctx->save_for_backward({x, weight, bias, f.save_mean, f.save_invstd, f.reserve,
                            ops == CUDNN_BATCHNORM_OPS_BN ? at::Tensor() : f.y});
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["ops"] = ops_code;
    return f.y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const auto ops = static_cast<cudnnBatchNormOps_t>(ctx->saved_data["ops"].toInt());
    const at::Tensor dy = grads[0].to(x.scalar_type()).contiguous(at::MemoryFormat::ChannelsLast);
    Backward b;
    CUDNN_CHECK(cudnn_backward(x, saved[6], dy, saved[1], saved[2], saved[3], saved[4], saved[5],
                               ctx->saved_data["eps"].toDouble(), ops, b));
    return {b.dx,         b.dz,         b.dweight,    b.dbias,     at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

enum class Path { kFused, kCudnnBn, kAten };

// One forward and backward of `ops` on a small NHWC tensor of this dtype: does cuDNN run it?
bool cudnn_runs(at::ScalarType dtype, int device_index, cudnnBatchNormOps_t ops) {
  at::NoGradGuard no_grad;
  const auto options = at::TensorOptions().device(at::kCUDA, device_index);
  constexpr int64_t kN = 2, kC = 64, kS = 8;
  // (N, C, S, S) in channels_last, no random numbers drawn (the run's generators stay as seeded).
  const at::Tensor x = at::linspace(-2, 2, kN * kS * kS * kC, options)
                           .view({kN, kS, kS, kC})
                           .permute({0, 3, 1, 2})
                           .to(dtype);
  const at::Tensor z = ops == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION
                           ? x.flip({0}).contiguous(at::MemoryFormat::ChannelsLast)
                           : at::Tensor();
  const at::Tensor weight = at::ones({kC}, options), bias = at::zeros({kC}, options);
  const at::Tensor mean = at::zeros({kC}, options), var = at::ones({kC}, options);
  const Forward f = cudnn_forward(x, z, weight, bias, mean, var, 0.1, 1e-5, ops);
  if (f.status != CUDNN_STATUS_SUCCESS) {
    spdlog::debug("cuDNN batch norm ops {} in {}: {}", static_cast<int>(ops), c10::toString(dtype),
                  cudnnGetErrorString(f.status));
    return false;
  }
  Backward b;
  const cudnnStatus_t status =
      cudnn_backward(x, ops == CUDNN_BATCHNORM_OPS_BN ? at::Tensor() : f.y, at::ones_like(f.y),
                     weight, bias, f.save_mean, f.save_invstd, f.reserve, 1e-5, ops, b);
  if (status != CUDNN_STATUS_SUCCESS)
    spdlog::debug("cuDNN batch norm backward ops {} in {}: {}", static_cast<int>(ops),
                  c10::toString(dtype), cudnnGetErrorString(status));
  return status == CUDNN_STATUS_SUCCESS;
}

// cudnn_runs, with a descriptor cuDNN refuses (a dtype this GPU lacks, say) counted as a no.
bool cudnn_accepts(at::ScalarType dtype, int device_index, cudnnBatchNormOps_t ops) {
  try {
    return cudnn_runs(dtype, device_index, ops);
  } catch (const std::runtime_error& e) {
    spdlog::debug("cuDNN batch norm ops {} in {}: {}", static_cast<int>(ops), c10::toString(dtype),
                  e.what());
    return false;
  }
}

Path path_for(at::ScalarType dtype, int device_index) {
  static std::mutex mutex;
  static std::map<std::pair<int, at::ScalarType>, Path> paths;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(device_index, dtype);
  if (auto it = paths.find(key); it != paths.end()) return it->second;
  Path path = Path::kAten;
  if (cudnn_accepts(dtype, device_index, CUDNN_BATCHNORM_OPS_BN_ACTIVATION) &&
      cudnn_accepts(dtype, device_index, CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION))
    path = Path::kFused;
  else if (cudnn_accepts(dtype, device_index, CUDNN_BATCHNORM_OPS_BN))
    path = Path::kCudnnBn;
  paths.emplace(key, path);
  return path;
}

bool fusable(const torch::nn::BatchNorm2dImpl& bn, const at::Tensor& x,
             const at::Tensor& residual) {
  const auto channels_last = at::MemoryFormat::ChannelsLast;
  const bool low_precision = x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16;
  const bool residual_fits = !residual.defined() || (residual.sizes() == x.sizes() &&
                                                     residual.scalar_type() == x.scalar_type() &&
                                                     residual.is_contiguous(channels_last));
  return bn.is_training() && bn.options.affine() && bn.options.track_running_stats() &&
         x.is_cuda() && x.dim() == 4 && low_precision && x.is_contiguous(channels_last) &&
         x.size(1) % 4 == 0 && x.numel() < std::numeric_limits<int32_t>::max() &&
         bn.weight.scalar_type() == at::kFloat && residual_fits;
}

// What follows the BN in ATen's ops: the residual add and the ReLU.
at::Tensor add_relu(at::Tensor y, const at::Tensor& residual, bool relu) {
  if (residual.defined()) y += residual;
  return relu ? y.relu_() : y;
}

}  // namespace

double batch_norm_averaging_factor(torch::nn::BatchNorm2dImpl& bn) {
  bn.num_batches_tracked += 1;
  if (bn.options.momentum()) return *bn.options.momentum();
  return 1.0 / bn.num_batches_tracked.item<double>();  // cumulative average, as torch's
}

at::Tensor batch_norm_act(torch::nn::BatchNorm2dImpl& bn, const at::Tensor& x,
                          const at::Tensor& residual, bool relu, bool fused) {
  TORCH_INTERNAL_ASSERT(relu || !residual.defined(), "a residual add is always followed by ReLU");
  const Path path =
      fused && fusable(bn, x, residual) ? path_for(x.scalar_type(), x.get_device()) : Path::kAten;
  if (path == Path::kAten) return add_relu(bn.forward(x), residual, relu);
  const double factor = batch_norm_averaging_factor(bn);
  const double eps = bn.options.eps();
  if (path == Path::kCudnnBn) {
    return add_relu(CudnnBatchNorm::apply(x, x, bn.weight, bn.bias, bn.running_mean, bn.running_var,
                                          factor, eps, CUDNN_BATCHNORM_OPS_BN),
                    residual, relu);
  }
  const cudnnBatchNormOps_t ops = !relu                ? CUDNN_BATCHNORM_OPS_BN
                                  : residual.defined() ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION
                                                       : CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
  return CudnnBatchNorm::apply(x, residual.defined() ? residual : x, bn.weight, bn.bias,
                               bn.running_mean, bn.running_var, factor, eps,
                               static_cast<int64_t>(ops));
}

std::string fused_batch_norm_path(at::ScalarType dtype, int device_index) {
  switch (path_for(dtype, device_index)) {
    case Path::kFused:
      return "cuDNN BN+ReLU and BN+add+ReLU";
    case Path::kCudnnBn:
      return "cuDNN BN, ATen add and ReLU";
    case Path::kAten:
      break;
  }
  return "ATen";
}

}  // namespace trainer
