#include "src/dist/process_group.h"

#include <c10/cuda/CUDAGuard.h>
#include <mpi.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "src/check.h"
#include "src/dist/watchdog.h"

namespace trainer {
namespace {

MPI_Datatype mpi_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return MPI_FLOAT;
    case at::kDouble:
      return MPI_DOUBLE;
    case at::kLong:
      return MPI_INT64_T;
    case at::kInt:
      return MPI_INT32_T;
    default:
      TORCH_CHECK(false, "no MPI reduction for ", type, "; use float32 on the CPU");
  }
}

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

// "Using network AWS Libfabric" and the like, from NCCL's INFO log of its initialisation.
std::string nccl_network_from_log(const std::string& path) {
  std::ifstream in(path);
  std::string line, network;
  while (std::getline(in, line)) {
    auto at = line.find("Using network ");
    if (at != std::string::npos) network = line.substr(at + 14);
  }
  return network.empty() ? "unknown (see NCCL_DEBUG=INFO)" : network;
}

std::atomic<bool> g_aborting{false};

// A blocking MPI collective in progress, timed by the watchdog when there is one: a rank that
// never joins (stopped, stuck, looping) must end the job, not hang it.
class HostCollective {
 public:
  HostCollective(Watchdog* watchdog, const char* what) : watchdog_(watchdog) {
    if (watchdog_) watchdog_->begin_host(what);
  }
  ~HostCollective() {
    if (watchdog_) watchdog_->end_host();
  }
  HostCollective(const HostCollective&) = delete;
  HostCollective& operator=(const HostCollective&) = delete;

 private:
  Watchdog* watchdog_;
};

}  // namespace

ProcessGroup::ProcessGroup(const Environment& env)
    : uses_mpi_(env.under_mpi), capture_nccl_log_(!env.nccl_debug_set) {
  if (!uses_mpi_) {
    hosts_ = {env.hostname};
    local_rank_ = env.local_rank;
    return;
  }
  int provided = 0;
  // The watchdog thread may call MPI_Abort while the main thread sits in a collective.
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &local_rank_);
  MPI_Comm_size(local, &local_size_);
  MPI_Comm_free(&local);

  char name[256] = {0};
  std::snprintf(name, sizeof(name), "%s", env.hostname.c_str());
  std::vector<char> all(256 * size_);
  MPI_Allgather(name, 256, MPI_CHAR, all.data(), 256, MPI_CHAR, MPI_COMM_WORLD);
  for (int r = 0; r < size_; ++r) hosts_.emplace_back(all.data() + 256 * r);
}

ProcessGroup::~ProcessGroup() {
  if (nccl_) ncclCommDestroy(nccl_);
  if (uses_mpi_) MPI_Finalize();
}

std::string ProcessGroup::init_nccl(c10::Device device) {
  if (!device.is_cuda() || !uses_mpi_) return "";
  const std::string log_path = "/tmp/trainer-nccl-init." + std::to_string(::getpid()) + ".log";
  if (capture_nccl_log_) capture_nccl_init_log(log_path);
  ncclUniqueId id;
  if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  c10::cuda::CUDAGuard guard(device);
  NCCL_CHECK(ncclCommInitRank(&nccl_, size_, id, rank_));
  int version = 0;
  NCCL_CHECK(ncclGetVersion(&version));
  const std::string network =
      capture_nccl_log_ ? nccl_network_from_log(log_path) : "see NCCL_DEBUG output";
  std::remove(log_path.c_str());
  return "NCCL " + std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) +
         "." + std::to_string(version % 100) + ", network: " + network;
}

// Collectives move a tensor's storage bytes as they lie. Any dense layout works (channels_last
// weights included) as long as every rank's tensor has the same strides, which holds for
// replicas of one model.
void ProcessGroup::allreduce_sum_(at::Tensor& tensor, cudaStream_t stream) {
  TORCH_INTERNAL_ASSERT(tensor.is_non_overlapping_and_dense());
  if (size_ == 1 && !nccl_) return;
  if (tensor.is_cuda()) {
    TORCH_INTERNAL_ASSERT(nccl_, "allreduce of a device tensor needs init_nccl first");
    NCCL_CHECK(ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                             nccl_type(tensor.scalar_type()), ncclSum, nccl_, stream));
    return;
  }
  HostCollective watched(watchdog_, "MPI all-reduce of a tensor");
  MPI_Allreduce(MPI_IN_PLACE, tensor.data_ptr(), static_cast<int>(tensor.numel()),
                mpi_type(tensor.scalar_type()), MPI_SUM, MPI_COMM_WORLD);
}

void ProcessGroup::broadcast_(at::Tensor& tensor, int root, cudaStream_t stream) {
  TORCH_INTERNAL_ASSERT(tensor.is_non_overlapping_and_dense());
  if (size_ == 1) return;
  if (tensor.is_cuda()) {
    TORCH_INTERNAL_ASSERT(nccl_, "broadcast of a device tensor needs init_nccl first");
    NCCL_CHECK(ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                             nccl_type(tensor.scalar_type()), root, nccl_, stream));
    return;
  }
  HostCollective watched(watchdog_, "MPI broadcast of a tensor");
  MPI_Bcast(tensor.data_ptr(), static_cast<int>(tensor.nbytes()), MPI_BYTE, root, MPI_COMM_WORLD);
}

int64_t ProcessGroup::sum(int64_t value) {
  if (!uses_mpi_) return value;
  int64_t total = 0;
  HostCollective watched(watchdog_, "MPI sum of a count");
  MPI_Allreduce(&value, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return total;
}

std::vector<double> ProcessGroup::allgather(double value) {
  std::vector<double> out(size_, value);
  if (!uses_mpi_) return out;
  HostCollective watched(watchdog_, "MPI allgather of a value");
  MPI_Allgather(&value, 1, MPI_DOUBLE, out.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
  return out;
}

void ProcessGroup::check_async_error() {
  if (!nccl_) return;
  ncclResult_t async = ncclSuccess;
  NCCL_CHECK(ncclCommGetAsyncError(nccl_, &async));
  if (async != ncclSuccess)
    throw std::runtime_error(std::string("NCCL reported an asynchronous error: ") +
                             ncclGetErrorString(async) + " (" + ncclGetLastError(nccl_) + ")");
}

void ProcessGroup::abort_job(int exit_code) {
  if (!g_aborting.exchange(true)) {
    if (nccl_) ncclCommAbort(nccl_);
    if (uses_mpi_) MPI_Abort(MPI_COMM_WORLD, exit_code);
  }
  std::_Exit(exit_code);
}

}  // namespace trainer
