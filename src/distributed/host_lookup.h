// What a rank looks up of its host and of the processes around it, for the liveness messages
// (src/distributed/liveness.h): the address it reaches a peer from, the addresses a host name
// resolves to, the host of torchrun's rendezvous, and the launcher's process above it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <set>
#include <string>

namespace trainer {

// The IPv4 address (network order) this host sends from toward `peer` (a name or an address);
// 0 when there is none.
uint32_t address_toward(const std::string& peer);

// The IPv4 addresses (network order) `host` resolves to.
std::set<uint32_t> addresses_of(const std::string& host);

// The host of torchrun's rendezvous: the Training Operator's PET_RDZV_ENDPOINT, or the agent's
// --rdzv-endpoint; "" when neither is known.
std::string rendezvous_host();

// The name of process `pid` (its /proc comm: "orted", "torchrun", ...).
std::string process_name(pid_t pid);

// The torchrun agent that started this rank (its parent), or 0 when none did. A host that
// cannot take part (its network or its file system gone) ends it (Note [A launcher that waits on
// lost hosts]), so that it does not start this rank again there, and the other hosts' agents
// start the group without it.
pid_t torchrun_agent();

// Note [A launcher that waits on lost hosts]
// SIGKILL, not SIGTERM: each launcher's way out on SIGTERM waits on a host it cannot reach.
// mpirun's daemon reports to mpirun and stays; torchrun's agent hears the signal only between
// its calls to the store, each of which waits up to a minute for the lost host. The launcher's
// other ranks on this host hear the same silence and end by themselves.

}  // namespace trainer
