#include "base/storage_calls.h"

#include <map>
#include <mutex>

namespace trainer {
namespace {

std::mutex calls_mutex;
std::map<uint64_t, StorageCall> calls;  // by id: the ids rise, so the first is the oldest
uint64_t next_id = 0;

}  // namespace

StorageCallScope::StorageCallScope(const char* verb, const std::string& path, int64_t offset) {
  StorageCall call{verb, path, offset, std::chrono::steady_clock::now(),
                   std::this_thread::get_id()};
  std::lock_guard<std::mutex> lock(calls_mutex);
  id_ = next_id++;
  calls.emplace(id_, std::move(call));
}

StorageCallScope::~StorageCallScope() {
  std::lock_guard<std::mutex> lock(calls_mutex);
  calls.erase(id_);
}

std::optional<StorageCall> oldest_storage_call(std::optional<std::thread::id> thread) {
  std::lock_guard<std::mutex> lock(calls_mutex);
  for (const auto& [id, call] : calls)
    if (!thread || call.thread == *thread) return call;
  return std::nullopt;
}

std::string describe_call(const StorageCall& call) {
  std::string text = std::string(call.verb) + " " + call.path;
  if (call.offset >= 0) text += " at byte " + std::to_string(call.offset);
  return text;
}

std::string describe_stuck(const StorageCall& call, std::chrono::steady_clock::time_point now) {
  const auto waited = std::chrono::duration_cast<std::chrono::seconds>(now - call.since).count();
  return describe_call(call) + " has not returned for " + std::to_string(waited) + " s";
}

}  // namespace trainer
