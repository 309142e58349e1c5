// HostComm under torchrun: LibTorch's c10d TCPStore at MASTER_ADDR:MASTER_PORT for the
// rendezvous, and LibTorch's Gloo process group over it for the collectives.
//
// Note [Gloo under torchrun]
// torchrun starts processes, not an MPI job, so host values and (without a GPU) the gradient
// buckets need a collective library that meets its peers through the c10d store. Gloo is the
// one torch.distributed itself uses for CPU tensors, it is compiled into LibTorch (nothing more
// to ship or load: one copy in the process), and its rendezvous is the store the launcher
// already provides. The wheel omits Gloo's headers; Debian's libgloo-dev supplies the
// declarations ProcessGroupGloo.hpp includes. ProcessGroupGloo holds every Gloo type behind a
// pointer, so its layout does not depend on Gloo's version, and this file calls only LibTorch's
// own functions; libgloo is never linked. On GPUs the gradients go through the project's NCCL
// reducer as under mpirun; Gloo then carries only the host values. (LibTorch's CMake target
// defines USE_C10D_GLOO, which ProcessGroupGloo.hpp needs, since its build has Gloo.)

#include <cstdlib>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "base/user_error.h"
#include "src/distributed/host_comm.h"

namespace trainer {
namespace {

c10::intrusive_ptr<c10d::Store> connect_store(const TorchrunEnvironment& t,
                                              std::chrono::seconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(t.master_port);
  options.isServer = t.rank == 0 && !t.agent_store;
  options.numWorkers = t.world_size;
  options.waitWorkers = false;  // the Gloo rendezvous below waits for every rank
  options.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(t.master_addr, options);
  } catch (const std::exception& e) {
    throw UserError(detail::concat(
        "rank ", t.rank, " cannot ", options.isServer ? "serve" : "reach",
        " the rendezvous store at MASTER_ADDR:MASTER_PORT = ", t.master_addr, ":", t.master_port,
        " within ", timeout.count(), " s (", std::string(e.what()).substr(0, 300),
        "). Fix: check that rank 0's address resolves and the port is free and open between ",
        "the pods"));
  }
  // Note [Store keys of a round]
  // The keys must be the same on every rank of a round and new in every round. A store served by
  // rank 0 is new in every round (the agent starts a new rank 0 each time), so a fixed prefix does.
  // The restart count is no round number: each agent counts its own restarts, and a pod that
  // replaces a lost one starts at 0 while the survivors count on; ranks that prefixed their keys
  // with it would wait for each other's keys forever. Only a store the agent serves outlives a
  // round; its keys then take the agent's count, as torch.distributed's own do (the PyTorchJob
  // turns that store off: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1).
  const std::string prefix = t.agent_store
                                 ? "resnet-trainer/attempt-" + std::to_string(t.restart_count)
                                 : std::string("resnet-trainer");
  return c10::make_intrusive<c10d::PrefixStore>(prefix, store);
}

// A dense tensor as one contiguous run of its elements (channels_last weights included): Gloo
// sums elementwise, so any layout works when every rank's has the same strides.
at::Tensor flat_view(const at::Tensor& tensor) {
  TORCH_INTERNAL_ASSERT(tensor.is_non_overlapping_and_dense());
  return tensor.as_strided({tensor.numel()}, {1});
}

class GlooComm final : public HostComm {
 public:
  GlooComm(const Environment& env, std::chrono::seconds timeout)
      : rank_(env.torchrun.rank),
        size_(env.torchrun.world_size),
        local_rank_(env.local_rank),
        local_size_(env.local_size) {
    // Twice the watchdog's limit: the watchdog, which names the collective and the step, speaks
    // first; Gloo's own timeout is the backstop.
    auto options = c10d::ProcessGroupGloo::Options::create(2 * timeout);
    options->devices.push_back(
        env.gloo_socket_ifname.empty()
            ? c10d::ProcessGroupGloo::createDefaultDevice()
            : c10d::ProcessGroupGloo::createDeviceForInterface(env.gloo_socket_ifname));
    group_ = c10::make_intrusive<c10d::ProcessGroupGloo>(connect_store(env.torchrun, timeout),
                                                         rank_, size_, options);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }

  void allreduce_sum_(at::Tensor& tensor) override {
    std::vector<at::Tensor> tensors{flat_view(tensor)};
    group_->allreduce(tensors)->wait();
  }
  void broadcast_(at::Tensor& tensor, int root) override {
    std::vector<at::Tensor> tensors{flat_view(tensor)};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    group_->broadcast(tensors, options)->wait();
  }
  void barrier() override { group_->barrier()->wait(); }
  // Gloo matches collectives by the order they are queued in, the same on every rank.
  std::function<int64_t()> start_sum(int64_t value) override {
    std::vector<at::Tensor> tensors{at::full({1}, value, at::kLong)};
    c10::intrusive_ptr<c10d::Work> work = group_->allreduce(tensors);
    return [work, tensors] {
      work->wait();
      return tensors[0].item<int64_t>();
    };
  }
  [[noreturn]] void abort(int exit_code) override { std::_Exit(exit_code); }

 private:
  int rank_, size_, local_rank_, local_size_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
};

}  // namespace

std::unique_ptr<HostComm> make_gloo_comm(const Environment& env, std::chrono::seconds timeout) {
  return std::make_unique<GlooComm>(env, timeout);
}

}  // namespace trainer
