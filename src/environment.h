// Every environment variable the trainer reads, parsed in this one place.
#pragma once

#include <string>

namespace trainer {

struct Environment {
  // This process's index among the processes on its node: picks the GPU. From
  // OMPI_COMM_WORLD_LOCAL_RANK (mpirun), else LOCAL_RANK (torchrun-style launchers), else 0.
  int local_rank = 0;
  std::string local_rank_source = "default";  // which variable gave local_rank
  // Processes on this node, sharing its cores: the default decode threads per rank are
  // cores / local_size. From OMPI_COMM_WORLD_LOCAL_SIZE, else LOCAL_WORLD_SIZE, else 1.
  int local_size = 1;
  std::string hostname;
  // Started by mpirun (OMPI_COMM_WORLD_SIZE or PMIX_RANK set): MPI is initialised. Started alone,
  // the process is a world of one and needs no MPI daemon.
  bool under_mpi = false;
  bool nccl_debug_set = false;       // the user chose NCCL_DEBUG; leave NCCL's logging as it is
  bool omp_num_threads_set = false;  // the user chose OMP_NUM_THREADS for LibTorch's CPU threads
};

// Asks NCCL to log its initialisation and network choice to `path` (NCCL_DEBUG=INFO,
// NCCL_DEBUG_SUBSYS=INIT,NET, NCCL_DEBUG_FILE), so the transport it picked can be reported.
// Call before the first NCCL communicator is created.
void capture_nccl_init_log(const std::string& path);

// Throws UserError when a variable is set to something that is not a non-negative integer.
Environment read_environment();

}  // namespace trainer
