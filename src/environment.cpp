#include "src/environment.h"

#include <unistd.h>

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
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) == 0) env.hostname = host;
  return env;
}

}  // namespace trainer
