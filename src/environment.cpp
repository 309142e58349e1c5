#include "src/environment.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "base/user_error.h"

namespace trainer {
namespace {

int parse_count(const char* name, const char* value, long limit = 1 << 20) {
  char* end = nullptr;
  long parsed = std::strtol(value, &end, 10);
  USER_CHECK(end != value && *end == '\0' && parsed >= 0 && parsed < limit, "environment ", name,
             "='", value, "' is not a non-negative integer below ", limit,
             ". Fix: unset it or let the launcher (mpirun, torchrun) set it");
  return static_cast<int>(parsed);
}

std::string get(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

// The first IPv4 address of mpirun's URI, "JOBID.0;tcp://A,B:PORT;tcp6://...".
std::string mpirun_address(const std::string& uri) {
  const auto at = uri.find("tcp://");
  if (at == std::string::npos) return "";
  const auto begin = at + 6;
  return uri.substr(begin, uri.find_first_of(",:;", begin) - begin);
}

// torchrun's variables, when WORLD_SIZE says there is more than one process or RANK is set.
void read_torchrun(Environment& env) {
  const std::string world = get("WORLD_SIZE"), rank = get("RANK");
  if (world.empty() && rank.empty()) return;
  TorchrunEnvironment& t = env.torchrun;
  t.world_size = world.empty() ? 1 : std::max(1, parse_count("WORLD_SIZE", world.c_str()));
  t.rank = rank.empty() ? 0 : parse_count("RANK", rank.c_str());
  USER_CHECK(t.rank < t.world_size, "environment RANK=", t.rank,
             " is not below WORLD_SIZE=", t.world_size,
             ". Fix: let the launcher (torchrun) set both");
  t.master_addr = get("MASTER_ADDR");
  const std::string port = get("MASTER_PORT");
  if (t.world_size == 1 && (t.master_addr.empty() || port.empty())) return;  // alone after all
  USER_CHECK(!t.master_addr.empty() && !port.empty(), "environment WORLD_SIZE=", t.world_size,
             " but MASTER_ADDR='", t.master_addr, "' and MASTER_PORT='", port,
             "': the ranks need both to meet. Fix: launch with torchrun, or set MASTER_ADDR and ",
             "MASTER_PORT to rank 0's address and a free port");
  t.master_port = parse_count("MASTER_PORT", port.c_str(), 65536);
  t.agent_store = get("TORCHELASTIC_USE_AGENT_STORE") == "True";
  if (const std::string restarts = get("TORCHELASTIC_RESTART_COUNT"); !restarts.empty())
    t.restart_count = parse_count("TORCHELASTIC_RESTART_COUNT", restarts.c_str());
  t.run_id = get("TORCHELASTIC_RUN_ID");
  env.launcher = Launcher::kTorchrun;
}

}  // namespace

Environment read_environment() {
  Environment env;
  if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK"))
    env.launcher = Launcher::kMpirun;
  else
    read_torchrun(env);
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK"}) {
    if (const char* value = std::getenv(name)) {
      env.local_rank = parse_count(name, value);
      env.local_rank_source = name;
      break;
    }
  }
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE"}) {
    if (const char* value = std::getenv(name)) {
      env.local_size = std::max(1, parse_count(name, value));
      break;
    }
  }
  env.launcher_address = env.launcher == Launcher::kTorchrun
                             ? env.torchrun.master_addr
                             : mpirun_address(get("OMPI_MCA_orte_hnp_uri"));
  env.gloo_socket_ifname = get("GLOO_SOCKET_IFNAME");
  env.nccl_debug_set = std::getenv("NCCL_DEBUG") != nullptr;
  env.omp_num_threads_set = std::getenv("OMP_NUM_THREADS") != nullptr;
  env.sample_trace_dir = get("TRAINER_SAMPLE_TRACE");
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
