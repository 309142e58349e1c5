#include "src/distributed/host_lookup.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

namespace trainer {

// A connected UDP socket sends nothing, but the kernel picks its route and source.
uint32_t address_toward(const std::string& peer) {
  if (peer.empty()) return 0;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(peer.c_str(), "9", &hints, &found) != 0 || !found) return 0;
  uint32_t address = 0;
  const int probe = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (probe >= 0 && ::connect(probe, found->ai_addr, found->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t size = sizeof(local);
    if (::getsockname(probe, reinterpret_cast<sockaddr*>(&local), &size) == 0)
      address = local.sin_addr.s_addr;
  }
  if (probe >= 0) ::close(probe);
  ::freeaddrinfo(found);
  return address;
}

std::string process_name(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

// The endpoint is "HOST:PORT"; the agent's is on its command line (torchrun passes it to no rank).
std::string rendezvous_host() {
  std::string endpoint;
  if (const char* pet = std::getenv("PET_RDZV_ENDPOINT")) endpoint = pet;
  if (endpoint.empty()) {
    std::ifstream in("/proc/" + std::to_string(::getppid()) + "/cmdline");
    std::string arg;
    bool next = false;
    while (std::getline(in, arg, '\0')) {
      if (next) endpoint = arg;
      next = arg == "--rdzv-endpoint" || arg == "--rdzv_endpoint";
      for (const char* flag : {"--rdzv-endpoint=", "--rdzv_endpoint="})
        if (arg.rfind(flag, 0) == 0) endpoint = arg.substr(std::string(flag).size());
    }
  }
  return endpoint.substr(0, endpoint.rfind(':'));
}

std::set<uint32_t> addresses_of(const std::string& host) {
  std::set<uint32_t> found;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* list = nullptr;
  if (host.empty() || ::getaddrinfo(host.c_str(), nullptr, &hints, &list) != 0) return found;
  for (addrinfo* a = list; a; a = a->ai_next)
    found.insert(reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr.s_addr);
  ::freeaddrinfo(list);
  return found;
}

pid_t torchrun_agent() {
  // torchrun sets TORCHELASTIC_RUN_ID for its workers; a launcher that only mimics its other
  // variables (RANK, WORLD_SIZE) does not, and is no agent to end.
  return std::getenv("TORCHELASTIC_RUN_ID") ? ::getppid() : 0;
}

}  // namespace trainer
