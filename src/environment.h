// Every environment variable the trainer reads, parsed in this one place: which launcher started
// the process (mpirun, torchrun and the launchers that set its variables, or none), where this
// process stands among the job's, and the debugging knobs.
#pragma once

#include <string>

namespace trainer {

enum class Launcher {
  kAlone,     // a world of one: no MPI, no store
  kMpirun,    // OpenMPI's mpirun (the MPI Operator's launcher): ranks and collectives from MPI
  kTorchrun,  // torchrun / TorchElastic / PyTorchJob: RANK, WORLD_SIZE, MASTER_ADDR:MASTER_PORT
};

// What torchrun and the launchers that mimic it (Kubeflow's PyTorchJob) set for each worker.
struct TorchrunEnvironment {
  int rank = 0;        // RANK
  int world_size = 1;  // WORLD_SIZE
  // MASTER_ADDR:MASTER_PORT: the c10d TCPStore the ranks meet at. Rank 0 serves it, unless the
  // elastic agent already does (TORCHELASTIC_USE_AGENT_STORE=True, as torchrun sets it).
  std::string master_addr;
  int master_port = 0;
  bool agent_store = false;
  // TORCHELASTIC_RESTART_COUNT: how many times the elastic agent has restarted the group (after
  // a failure or a membership change); > 0 means resume from the newest checkpoint.
  int restart_count = 0;
  std::string run_id;  // TORCHELASTIC_RUN_ID, for the log
};

struct Environment {
  Launcher launcher = Launcher::kAlone;
  TorchrunEnvironment torchrun;  // when launcher == kTorchrun
  // This process's index among the processes on its node: picks the GPU. From
  // OMPI_COMM_WORLD_LOCAL_RANK (mpirun), else LOCAL_RANK (torchrun-style launchers), else 0.
  int local_rank = 0;
  std::string local_rank_source = "default";  // which variable gave local_rank
  // Processes on this node, sharing its cores: the default decode threads per rank are
  // cores / local_size. From OMPI_COMM_WORLD_LOCAL_SIZE, else LOCAL_WORLD_SIZE, else 1.
  int local_size = 1;
  std::string hostname;
  // An address of the launcher's host: mpirun's (OMPI_MCA_orte_hnp_uri) or the store's
  // (MASTER_ADDR). The route to it is the network the other hosts reach this one by.
  std::string launcher_address;
  // GLOO_SOCKET_IFNAME: the network interface Gloo uses under torchrun (default: the one this
  // host's name resolves to), as torch.distributed reads it.
  std::string gloo_socket_ifname;
  bool nccl_debug_set = false;       // the user chose NCCL_DEBUG; leave NCCL's logging as it is
  bool omp_num_threads_set = false;  // the user chose OMP_NUM_THREADS for LibTorch's CPU threads
  // TRAINER_SAMPLE_TRACE: a folder where each rank records the samples it trains (debugging and
  // tests; src/report/sample_trace.h). Empty: off.
  std::string sample_trace_dir;
};

// Asks NCCL to log its initialisation and network choice to `path` (NCCL_DEBUG=INFO,
// NCCL_DEBUG_SUBSYS=INIT,NET, NCCL_DEBUG_FILE), so the transport it picked can be reported.
// Call before the first NCCL communicator is created.
void capture_nccl_init_log(const std::string& path);

// Throws UserError when a variable is set to something that is not a non-negative integer, or
// when torchrun's variables are half there.
Environment read_environment();

}  // namespace trainer
