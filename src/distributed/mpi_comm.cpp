// HostComm under mpirun: MPI_COMM_WORLD.
#include <mpi.h>

#include <cstdlib>
#include <memory>

#include "base/mpi_check.h"
#include "src/distributed/host_comm.h"

// AddressSanitizer's leak checker (clang's feature test; GCC defines __SANITIZE_ADDRESS__).
#if defined(__SANITIZE_ADDRESS__)
#define TRAINER_LEAK_CHECK 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TRAINER_LEAK_CHECK 1
#endif
#endif
#ifdef TRAINER_LEAK_CHECK
#include <sanitizer/lsan_interface.h>
#endif

namespace trainer {
namespace {

// Note [Open MPI under LeakSanitizer]
// Open MPI does not free what its components allocate as MPI_Init_thread loads them, nor what
// MPI_Finalize drops. Many of those allocations were made by components it has unloaded by the
// time the leak check runs at exit, so their reports name no module a suppression could match. In a
// sanitizer build the leak check of a rank under mpirun therefore skips what MPI_Init_thread
// allocates on this thread, and runs before MPI_Finalize instead of at exit: by then every object
// of ours is gone, so our leaks are still reported, and what Open MPI has lost while running comes
// from libraries still loaded, which tests/sanitizers/lsan.supp can name (PMIx's).
#ifdef TRAINER_LEAK_CHECK
using IgnoreLeaksOfThisThread = __lsan::ScopedDisabler;
void check_leaks_now() { __lsan_do_leak_check(); }
#else
struct IgnoreLeaksOfThisThread {};
void check_leaks_now() {}
#endif

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
    case at::kByte:
      return MPI_UINT8_T;
    default:
      TORCH_CHECK(false, "no MPI reduction for ", type, "; use float32 on the CPU");
  }
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    default:
      return "MPI_THREAD_MULTIPLE";
  }
}

class MpiComm final : public HostComm {
 public:
  MpiComm() {
    const IgnoreLeaksOfThisThread open_mpi_init;  // Note [Open MPI under LeakSanitizer]
    int provided = 0;
    MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    // Errors come back as codes for MPI_CHECK to throw, instead of MPI's default abort, which
    // would end the job without saying which call failed on which rank.
    MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    // The watchdog thread may call MPI_Abort while the main thread sits in a collective.
    USER_CHECK(provided >= MPI_THREAD_MULTIPLE, "the MPI library grants thread level ",
               thread_level_name(provided),
               ", and the collective watchdog needs MPI_THREAD_MULTIPLE (a second thread may end "
               "the job while the first waits in a collective). Fix: run with an MPI built with "
               "thread support (Open MPI 4 and 5 are by default; `ompi_info | grep -i thread` "
               "says), or launch with torchrun, which needs no MPI");
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
    MPI_Comm local;
    MPI_CHECK(
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local));
    MPI_CHECK(MPI_Comm_rank(local, &local_rank_));
    MPI_CHECK(MPI_Comm_size(local, &local_size_));
    MPI_CHECK(MPI_Comm_free(&local));
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &sums_));
  }
  // A destructor cannot throw: a failed MPI_Finalize at exit changes nothing the run has written.
  ~MpiComm() override {
    MPI_Comm_free(&sums_);
    check_leaks_now();  // Note [Open MPI under LeakSanitizer]
    MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }

  // Collectives move a tensor's storage bytes as they lie: any dense layout (channels_last
  // weights included) works when every rank's tensor has the same strides.
  void allreduce_sum_(at::Tensor& tensor) override {
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, tensor.data_ptr(), static_cast<int>(tensor.numel()),
                            mpi_type(tensor.scalar_type()), MPI_SUM, MPI_COMM_WORLD));
  }
  void broadcast_(at::Tensor& tensor, int root) override {
    MPI_CHECK(MPI_Bcast(tensor.data_ptr(), static_cast<int>(tensor.nbytes()), MPI_BYTE, root,
                        MPI_COMM_WORLD));
  }
  void barrier() override { MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD)); }
  std::function<int64_t()> start_sum(int64_t value) override {
    struct Sum {  // where MPI reads and writes until the wait
      int64_t value = 0, total = 0;
      MPI_Request request = MPI_REQUEST_NULL;
    };
    auto sum = std::make_shared<Sum>();
    sum->value = value;
    MPI_CHECK(
        MPI_Iallreduce(&sum->value, &sum->total, 1, MPI_INT64_T, MPI_SUM, sums_, &sum->request));
    return [sum] {
      MPI_CHECK(MPI_Wait(&sum->request, MPI_STATUS_IGNORE));
      return sum->total;
    };
  }
  [[noreturn]] void abort(int exit_code) override {
    MPI_Abort(MPI_COMM_WORLD, exit_code);  // does not return where it works; _Exit where not
    std::_Exit(exit_code);
  }

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  // start_sum's own communicator: its sums may overlap the collectives on MPI_COMM_WORLD in
  // any order.
  MPI_Comm sums_ = MPI_COMM_NULL;
};

}  // namespace

std::unique_ptr<HostComm> make_mpi_comm() { return std::make_unique<MpiComm>(); }

}  // namespace trainer
