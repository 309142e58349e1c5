#include "src/environment.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "src/check.h"

namespace trainer {
namespace {

int parse_rank(const char* name, const char* value) {
  char* end = nullptr;
  long parsed = std::strtol(value, &end, 10);
  USER_CHECK(end != value && *end == '\0' && parsed >= 0 && parsed < 1 << 20, "environment ", name,
             "='", value, "' is not a non-negative integer. Fix: unset it or let the ",
             "launcher (mpirun) set it");
  return static_cast<int>(parsed);
}

}  // namespace

Environment read_environment() {
  Environment env;
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK"}) {
    if (const char* value = std::getenv(name)) {
      env.local_rank = parse_rank(name, value);
      env.local_rank_source = name;
      break;
    }
  }
  env.under_mpi = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK");
  env.nccl_debug_set = std::getenv("NCCL_DEBUG") != nullptr;
  env.omp_num_threads_set = std::getenv("OMP_NUM_THREADS") != nullptr;
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE"}) {
    if (const char* value = std::getenv(name)) {
      env.local_size = std::max(1, parse_rank(name, value));
      break;
    }
  }
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) == 0) env.hostname = host;
  return env;
}

void capture_nccl_init_log(const std::string& path) {
  ::setenv("NCCL_DEBUG", "INFO", /*overwrite=*/1);
  ::setenv("NCCL_DEBUG_SUBSYS", "INIT,NET", 1);
  ::setenv("NCCL_DEBUG_FILE", path.c_str(), 1);
}

}  // namespace trainer
