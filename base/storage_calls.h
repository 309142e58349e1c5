// Calls into a file system that may never return. A network file system whose server or link is
// gone (FSx for Lustre, NFS) blocks a read, an open or a directory listing in the kernel, where
// no signal but SIGKILL reaches it. So each such call of the data's is entered here while it runs,
// and a thread of the job's (src/run/storage_watch.h) ends the run when one has not returned
// within its deadline, naming the call and the file; the liveness messages tell the other ranks.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>

namespace trainer {

struct StorageCall {
  const char* verb;     // "reading", "opening", "listing", ...: what the call does
  std::string path;     // the file or folder it does it to
  int64_t offset = -1;  // the byte a read starts at; -1 when none
  std::chrono::steady_clock::time_point since;
  std::thread::id thread;
};

// While it lives, its call is in flight. Cheap next to any call into a file system: one lock.
class StorageCallScope {
 public:
  StorageCallScope(const char* verb, const std::string& path, int64_t offset = -1);
  ~StorageCallScope();
  StorageCallScope(const StorageCallScope&) = delete;
  StorageCallScope& operator=(const StorageCallScope&) = delete;

 private:
  uint64_t id_;
};

// The call in flight the longest (of `thread` alone, when given), if any.
std::optional<StorageCall> oldest_storage_call(
    std::optional<std::thread::id> thread = std::nullopt);

// "reading /fsx/train-00001 at byte 4096"
std::string describe_call(const StorageCall& call);
// "reading /fsx/train-00001 at byte 4096 has not returned for 61 s"
std::string describe_stuck(const StorageCall& call, std::chrono::steady_clock::time_point now);

}  // namespace trainer
