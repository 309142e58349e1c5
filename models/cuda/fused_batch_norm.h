// Batch norm with its ReLU, or with the residual add and ReLU, as one cuDNN kernel forward and one
// backward (cuDNN's CUDNN_BATCHNORM_OPS_BN_ACTIVATION and _BN_ADD_ACTIVATION, the fusions NVIDIA's
// MLPerf ResNet-50 uses), instead of ATen's two or three passes over the activation each way.
// It runs where cuDNN has it: a training-mode BN on the GPU over channels_last fp16 or bf16
// activations. Everywhere else (the CPU, fp32, evaluation, NCHW) the same ATen ops as before run.
// Note [Fused batch norm] in the .cpp says how a dtype cuDNN lacks falls back.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/batchnorm.h>

#include <string>

namespace trainer {

// relu(bn(x) + residual) when residual is defined, else relu(bn(x)); with relu false, bn(x) (no
// residual). Updates bn's running statistics and batch count as bn->forward(x) does. fused false
// runs ATen's ops always (the `fused_batch_norm` key).
at::Tensor batch_norm_act(torch::nn::BatchNorm2dImpl& bn, const at::Tensor& x,
                          const at::Tensor& residual, bool relu, bool fused);

// The weight of this batch in bn's running statistics, counting the batch as
// BatchNormImplBase::forward does (num_batches_tracked + 1): the momentum, or 1 / batches without.
double batch_norm_averaging_factor(torch::nn::BatchNorm2dImpl& bn);

// What batch_norm_act runs for this dtype on the GPU, in words, for the run's log: "cuDNN
// BN+ReLU and BN+add+ReLU", "cuDNN BN, ATen add and ReLU", or "ATen". Probes cuDNN once per dtype.
std::string fused_batch_norm_path(at::ScalarType dtype, int device_index);

}  // namespace trainer
