#include "src/distributed/process_group.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "base/user_error.h"
#include "src/distributed/nccl_comm.h"

namespace trainer {
namespace {

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

// A blocking host collective in progress, timed by the watchdog when there is one: a rank that
// never joins (stopped, stuck, looping) must end the job, not hang it.
class HostCollective {
 public:
  HostCollective(CollectiveWatch* watchdog, const char* what) : watchdog_(watchdog) {
    if (watchdog_) watchdog_->begin_host(what);
  }
  ~HostCollective() {
    if (watchdog_) watchdog_->end_host();
  }
  HostCollective(const HostCollective&) = delete;
  HostCollective& operator=(const HostCollective&) = delete;

 private:
  CollectiveWatch* watchdog_;
};

constexpr int kHostnameBytes = 256;

}  // namespace

ProcessGroup::ProcessGroup(const Environment& env, std::chrono::seconds timeout)
    : launcher_(env.launcher), capture_nccl_log_(!env.nccl_debug_set) {
  if (launcher_ == Launcher::kMpirun) comm_ = make_mpi_comm();
  if (launcher_ == Launcher::kTorchrun) comm_ = make_gloo_comm(env, timeout);
  if (!comm_) {
    local_rank_ = env.local_rank;
    hosts_ = {env.hostname};
    return;
  }
  rank_ = comm_->rank();
  size_ = comm_->size();
  local_rank_ = comm_->local_rank();
  local_size_ = comm_->local_size();
  hosts_ = gather_hostnames(env.hostname);
}

ProcessGroup::~ProcessGroup() = default;

// Each rank fills its own slot of a zeroed table; the sum over ranks is every rank's name.
std::vector<std::string> ProcessGroup::gather_hostnames(const std::string& mine) {
  at::Tensor table = at::zeros({size_, kHostnameBytes}, at::kByte);
  std::memcpy(table[rank_].data_ptr(), mine.data(),
              std::min<size_t>(mine.size(), kHostnameBytes - 1));
  comm_->allreduce_sum_(table);
  std::vector<std::string> hosts;
  for (int r = 0; r < size_; ++r)
    hosts.emplace_back(reinterpret_cast<const char*>(table[r].data_ptr()));
  return hosts;
}

std::string ProcessGroup::init_nccl(c10::Device device) {
  if (!device.is_cuda() || !comm_) return "";
  const std::string log_path = "/tmp/trainer-nccl-init." + std::to_string(::getpid()) + ".log";
  if (capture_nccl_log_) capture_nccl_init_log(log_path);
  c10::cuda::CUDAGuard guard(device);
  nccl_ = std::make_unique<NcclComm>(*comm_, [this](const char* what, const auto& step) {
    HostCollective watched(watchdog_, what);
    step();
  });
  const std::string network =
      capture_nccl_log_ ? nccl_network_from_log(log_path) : "see NCCL_DEBUG output";
  std::remove(log_path.c_str());
  return "NCCL " + NcclComm::version() + ", network: " + network;
}

// Collectives move a tensor's storage bytes as they lie. Any dense layout works (channels_last
// weights included) as long as every rank's tensor has the same strides, which holds for
// replicas of one model.
void ProcessGroup::allreduce_sum_(at::Tensor& tensor, cudaStream_t stream) {
  TORCH_INTERNAL_ASSERT(tensor.is_non_overlapping_and_dense());
  if (size_ == 1 && !nccl_) return;
  if (tensor.is_cuda()) {
    TORCH_INTERNAL_ASSERT(nccl_, "allreduce of a device tensor needs init_nccl first");
    nccl_->allreduce_sum_(tensor, stream);
    return;
  }
  HostCollective watched(watchdog_, "the all-reduce of a host tensor");
  comm_->allreduce_sum_(tensor);
}

void ProcessGroup::broadcast_(at::Tensor& tensor, int root, cudaStream_t stream) {
  TORCH_INTERNAL_ASSERT(tensor.is_non_overlapping_and_dense());
  if (size_ == 1) return;
  if (tensor.is_cuda()) {
    TORCH_INTERNAL_ASSERT(nccl_, "broadcast of a device tensor needs init_nccl first");
    nccl_->broadcast_(tensor, root, stream);
    return;
  }
  HostCollective watched(watchdog_, "the broadcast of a host tensor");
  comm_->broadcast_(tensor, root);
}

int64_t ProcessGroup::sum(int64_t value, const char* what) {
  if (!comm_) return value;
  at::Tensor total = at::full({1}, value, at::kLong);
  HostCollective watched(watchdog_, what);
  comm_->allreduce_sum_(total);
  return total.item<int64_t>();
}

std::function<int64_t()> ProcessGroup::start_sum(int64_t value, std::string what) {
  if (!comm_) return [value] { return value; };
  return [this, wait = comm_->start_sum(value), what = std::move(what)] {
    HostCollective watched(watchdog_, what.c_str());
    return wait();
  };
}

void ProcessGroup::barrier(const char* what) {
  if (!comm_) return;
  HostCollective watched(watchdog_, what);
  comm_->barrier();
}

std::vector<double> ProcessGroup::allgather(double value) {
  if (!comm_) return std::vector<double>(size_, value);
  at::Tensor all = at::zeros({size_}, at::kDouble);  // each rank its own slot; the sum is exact
  all.data_ptr<double>()[rank_] = value;
  HostCollective watched(watchdog_, "the allgather of a value");
  comm_->allreduce_sum_(all);
  return std::vector<double>(all.data_ptr<double>(), all.data_ptr<double>() + size_);
}

void ProcessGroup::check_async_error() {
  if (nccl_) nccl_->check_async_error();
}

void ProcessGroup::abort_job(int exit_code, bool peers_told) {
  if (!g_aborting.exchange(true)) {
    if (nccl_) nccl_->abort();
    if (comm_ && !peers_told) comm_->abort(exit_code);
  }
  std::_Exit(exit_code);
}

}  // namespace trainer
