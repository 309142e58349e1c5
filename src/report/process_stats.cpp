#include "src/report/process_stats.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace trainer {

double seconds_since_process_start() {
  std::ifstream stat("/proc/self/stat"), uptime("/proc/uptime");
  std::string line;
  double up = 0;
  if (!std::getline(stat, line) || !(uptime >> up)) return 0;
  // Fields after the command name, which may hold spaces: it ends at the last ')'.
  std::istringstream fields(line.substr(line.rfind(')') + 2));
  std::string field;
  for (int i = 3; i < 22 && fields >> field; ++i) {
  }
  long long start_ticks = 0;  // field 22: start time, clock ticks after boot
  if (!(fields >> start_ticks)) return 0;
  return up - static_cast<double>(start_ticks) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

namespace {

// One counter of /proc/self/io ("rchar:", "read_bytes:"); 0 when it is not readable.
int64_t io_counter(const std::string& name) {
  std::ifstream io("/proc/self/io");
  std::string key;
  int64_t value = 0;
  while (io >> key >> value)
    if (key == name) return value;
  return 0;
}

}  // namespace

int64_t bytes_read_by_process() { return io_counter("rchar:"); }

int64_t bytes_read_from_storage() { return io_counter("read_bytes:"); }

}  // namespace trainer
