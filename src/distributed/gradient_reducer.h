// Data-parallel gradient averaging. Gradients are packed into buckets of up to `bucket_bytes` in
// reverse registration order (roughly the order backward produces them), the input-most bucket
// small (Note [Bucket sizes] in gradient_reducer.cpp). A hook on each parameter copies its
// gradient into its bucket (divided by the world size in the same pass, when predividing); when a
// bucket's last gradient arrives, the bucket is all-reduced on a communication stream while
// backward goes on. Buckets are launched strictly in index order, so every rank issues the same
// collectives in the same order (NCCL requires it): Note [Bucket order]. finish_step() makes the
// compute stream wait for the reductions and hands each parameter its averaged gradient as its
// .grad, with no host sync: a view of the bucket (no copy back) unless the wire is compressed
// (Note [Gradients as bucket views]). Without a GPU the same buckets are summed with MPI on the
// CPU, after backward.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>
#include <vector>

#include "src/distributed/process_group.h"

namespace trainer {

struct ReducerOptions {
  int64_t bucket_bytes = 25 << 20;  // DDP's default; Horovod fuses up to 64 MB
  bool predivide = true;            // divide by the world size before summing (no fp16 overflow)
  at::ScalarType wire_dtype = at::kFloat;  // kHalf / kBFloat16: compressed on the wire (GPU only)
  int64_t last_bucket_bytes = 1 << 20;     // the input-most bucket: its all-reduce is never hidden
};

class GradientReducer {
 public:
  GradientReducer(const std::vector<at::Tensor>& params, ProcessGroup& group,
                  const ReducerOptions& options);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Before backward: arms the buckets for a new step and drops every .grad (what backward
  // produces from here on is what gets averaged).
  void prepare_step();
  // While set, backward's gradients are summed into the buckets and nothing is launched: every
  // micro-batch of a step but the last. The last backward (unset) adds its own and launches.
  void set_accumulating(bool accumulating) { accumulating_ = accumulating; }
  // After backward: launches what is left, orders the current stream after every reduction and
  // sets each .grad to the average over ranks. The .grad tensors stay valid until the next
  // prepare_step; in-place changes to them (unscaling, the optimizer's) are fine.
  void finish_step();

  int64_t bucket_count() const { return static_cast<int64_t>(buckets_.size()); }
  // Parameter indices per bucket, in launch order (a parameter larger than the cap gets its own).
  static std::vector<std::vector<int64_t>> bucket_members(const std::vector<at::Tensor>& params,
                                                          const ReducerOptions& options);

 private:
  struct Slot {
    int64_t bucket;
    int64_t offset;  // elements into the bucket buffer
  };
  struct Bucket {
    std::vector<int64_t> params;                     // indices into params_
    at::Tensor buffer;                               // (elements) wire dtype, flat
    int64_t pending = 0;                             // gradients not yet copied in this step
    std::optional<at::cuda::CUDAEvent> ready, done;  // GPU: copy-in done / reduction done
  };

  void on_gradient(int64_t param, const at::Tensor& grad);
  void launch_ready_buckets();
  void launch(Bucket& bucket, int64_t index);
  std::vector<at::Tensor> params_;
  std::vector<Slot> slots_;
  std::vector<at::Tensor> slot_views_;  // each param's region of its bucket, in its strides
  bool grads_are_views_;                // wire dtype == parameter dtype: .grad = slot view
  std::vector<bool> arrived_;           // this step: gradient copied in
  std::vector<bool> accumulated_;       // this step: a gradient summed in while accumulating
  bool accumulating_ = false;
  std::vector<Bucket> buckets_;
  c10::Device device_;  // the parameters'
  double copy_scale_;   // gradients enter the buckets times this: 1/world size when predividing
  int64_t next_launch_ = 0;  // buckets launch in index order
  ProcessGroup& group_;
  ReducerOptions options_;
  std::optional<c10::cuda::CUDAStream> comm_stream_;
  std::vector<unsigned> hook_handles_;
};

}  // namespace trainer
