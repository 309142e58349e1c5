// Every environment variable the trainer reads, parsed in this one place.
#pragma once

#include <string>

namespace trainer {

struct Environment {
  // This process's index among the processes on its node: picks the GPU. From
  // OMPI_COMM_WORLD_LOCAL_RANK (mpirun), else LOCAL_RANK (torchrun-style launchers), else 0.
  int local_rank = 0;
  std::string local_rank_source = "default";  // which variable gave local_rank
  std::string hostname;
};

// Throws UserError when a variable is set to something that is not a non-negative integer.
Environment read_environment();

}  // namespace trainer
