// NcclComm: NCCL's communicator, set up over the launcher's host transport.
#include "src/distributed/nccl_comm.h"

#include <ATen/ATen.h>

#include "base/nccl_check.h"

namespace trainer {
namespace {

ncclDataType_t nccl_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return ncclFloat32;
    case at::kHalf:
      return ncclFloat16;
    case at::kBFloat16:
      return ncclBfloat16;
    case at::kDouble:
      return ncclFloat64;
    case at::kLong:
      return ncclInt64;
    default:
      TORCH_CHECK(false, "no NCCL type for ", type);
  }
}

}  // namespace

NcclComm::NcclComm(HostComm& bootstrap, const WatchedStep& watched) {
  ncclUniqueId id;
  if (bootstrap.rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  at::Tensor id_bytes = at::from_blob(&id, {static_cast<int64_t>(sizeof(id))}, at::kByte);
  watched("the broadcast of the NCCL id", [&] { bootstrap.broadcast_(id_bytes, 0); });
  watched("NCCL communicator set-up",
          [&] { NCCL_CHECK(ncclCommInitRank(&comm_, bootstrap.size(), id, bootstrap.rank())); });
}

NcclComm::~NcclComm() {
  if (comm_) ncclCommDestroy(comm_);
}

void NcclComm::allreduce_sum_(at::Tensor& tensor, cudaStream_t stream) {
  NCCL_CHECK(ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                           nccl_type(tensor.scalar_type()), ncclSum, comm_, stream));
}

void NcclComm::broadcast_(at::Tensor& tensor, int root, cudaStream_t stream) {
  NCCL_CHECK(ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                           nccl_type(tensor.scalar_type()), root, comm_, stream));
}

void NcclComm::check_async_error() {
  ncclResult_t async = ncclSuccess;
  NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
  if (async != ncclSuccess)
    throw std::runtime_error(std::string("NCCL reported an asynchronous error: ") +
                             ncclGetErrorString(async) + " (" + ncclGetLastError(comm_) + ")");
}

void NcclComm::abort() { ncclCommAbort(comm_); }

std::string NcclComm::version() {
  int version = 0;
  NCCL_CHECK(ncclGetVersion(&version));
  return std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100);
}

}  // namespace trainer
