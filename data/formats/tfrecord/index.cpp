#include "data/formats/tfrecord/index.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>

#include "base/storage_calls.h"
#include "base/user_error.h"
#include "data/formats/tfrecord/crc32c.h"
#include "data/formats/tfrecord/file.h"

namespace trainer {
namespace {

constexpr int64_t kScanChunk = 8 << 20;  // bytes per read while scanning: large for Lustre
// The longest line of an index file read: `<offset> <size>\n` is at most 19 + 1 + 8 + 1 bytes.
constexpr int64_t kMaxIndexLineBytes = 64;

// True when `entries` tile a prefix of a file of `file_size` bytes with framed records, none over
// kMaxRecordBytes (an entry past the end, or too large, makes the index stale: it is rebuilt, and
// the scan reports the record). Compared without overflow: the entries are the file's word.
bool consistent(const std::vector<IndexEntry>& entries, int64_t file_size) {
  int64_t end = 0;
  for (const auto& e : entries) {
    if (e.offset != end || e.size < kRecordOverhead || e.size > kMaxRecordBytes + kRecordOverhead ||
        e.size > file_size - end)
      return false;
    end += e.size;
  }
  return end == file_size;
}

// Checks only the frame of the record at `p` (its length and the length's CRC) and that it fits
// in the `remaining` bytes of the file; sets the framed size.
RecordStatus check_frame(const uint8_t* p, int64_t available, int64_t remaining, int64_t* size) {
  if (available < 12 || remaining < kRecordOverhead) return RecordStatus::kTruncated;
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | p[i];
  const uint32_t stored =
      uint32_t(p[8]) | uint32_t(p[9]) << 8 | uint32_t(p[10]) << 16 | uint32_t(p[11]) << 24;
  if (mask_crc(crc32c(p, 8)) != stored) return RecordStatus::kBadLengthCrc;
  if (length > static_cast<uint64_t>(kMaxRecordBytes)) return RecordStatus::kTooLarge;
  if (length > static_cast<uint64_t>(remaining - kRecordOverhead)) return RecordStatus::kTruncated;
  *size = static_cast<int64_t>(length) + kRecordOverhead;
  return RecordStatus::kOk;
}

}  // namespace

ScanResult scan_tfrecord_file(const std::string& path, bool check_payload_crc) {
  ReadFile file(path);
  file.advise_sequential(0, file.size());
  ScanResult result;
  std::vector<uint8_t> buffer;
  int64_t buffer_offset = 0, offset = 0;  // file offset of buffer[0]; of the next record
  // Makes [offset, offset + need) resident (as far as the file goes) with one large read.
  auto ensure = [&](int64_t need) {
    if (buffer_offset + static_cast<int64_t>(buffer.size()) >= offset + need) return;
    // No larger than what is left of the file: a small file, or a shard's tail, is one small read.
    const int64_t want = std::max(need, std::min(kScanChunk, file.size() - offset));
    buffer.resize(static_cast<size_t>(want));
    buffer.resize(static_cast<size_t>(file.read_at(offset, buffer.data(), want)));
    buffer_offset = offset;
  };
  while (offset < file.size()) {
    ensure(12);
    auto available = [&] { return buffer_offset + static_cast<int64_t>(buffer.size()) - offset; };
    int64_t size = 0;
    auto here = [&] { return buffer.data() + (offset - buffer_offset); };
    RecordStatus status = check_frame(here(), available(), file.size() - offset, &size);
    if (status == RecordStatus::kOk && check_payload_crc) {
      ensure(size);  // at most kMaxRecordBytes + kRecordOverhead: check_frame's limit
      std::string_view payload;
      status = parse_record(here(), available(), &payload, &size);
    }
    if (status != RecordStatus::kOk) {
      result.bad.push_back({path, offset, describe(status, here(), available())});
      break;  // the frame is lost: no way to find the next record
    }
    result.entries.push_back({offset, size});
    offset += size;
  }
  return result;
}

std::vector<IndexEntry> read_index_file(const std::string& path, int64_t most_entries) {
  const StorageCallScope call("reading", path);
  std::ifstream in(path);
  USER_CHECK(in, "cannot read index file '", path, "'");
  std::vector<IndexEntry> entries;
  std::string line;
  for (int64_t number = 1;
       static_cast<int64_t>(entries.size()) <= most_entries && std::getline(in, line); ++number) {
    if (line.empty()) continue;
    std::istringstream fields(line);
    IndexEntry e;
    std::string rest;
    USER_CHECK((fields >> e.offset >> e.size) && !(fields >> rest) && e.offset >= 0 &&
                   e.size >= kRecordOverhead,
               "index file '", path, "' line ", number, " is not `<offset> <size>`: '", line,
               "'. Fix: delete it; it is rebuilt from the data");
    entries.push_back(e);
  }
  return entries;
}

bool write_index_file(const std::string& path, const std::vector<IndexEntry>& entries) {
  namespace fs = std::filesystem;
  const StorageCallScope call("writing", path);
  const fs::path target(path);
  const std::string temporary = (target.parent_path() / ("." + target.filename().string() +
                                                         ".tmp." + std::to_string(::getpid())))
                                    .string();
  {
    std::ofstream out(temporary);
    if (!out) return false;
    for (const auto& e : entries) out << e.offset << ' ' << e.size << '\n';
    out.flush();
    if (!out) {
      std::remove(temporary.c_str());
      return false;
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    return false;
  }
  return true;
}

std::string cached_index_path(const std::string& data_path, const std::string& cache_dir) {
  namespace fs = std::filesystem;
  const std::string absolute = fs::absolute(data_path).lexically_normal().string();
  char hash[17];
  std::snprintf(hash, sizeof(hash), "%016zx", std::hash<std::string>{}(absolute));
  return (fs::path(cache_dir) / (fs::path(data_path).filename().string() + "." + hash + ".idx"))
      .string();
}

std::vector<IndexEntry> load_or_build_index(const std::string& data_path,
                                            const std::string& cache_dir,
                                            std::vector<BadRecord>* bad) {
  namespace fs = std::filesystem;
  std::error_code error;
  const int64_t file_size = [&] {
    const StorageCallScope call("looking at", data_path);
    return static_cast<int64_t>(fs::file_size(data_path, error));
  }();
  USER_CHECK(!error, "cannot read TFRecord file '", data_path, "': ", error.message());
  const std::string beside = data_path + ".idx";
  const std::string cached = cache_dir.empty() ? "" : cached_index_path(data_path, cache_dir);
  for (const std::string& candidate : {beside, cached}) {
    if (candidate.empty()) continue;
    const StorageCallScope call("looking for", candidate);
    if (!fs::exists(candidate, error)) continue;
    // A file of `file_size` bytes holds at most file_size / kRecordOverhead records: an index
    // longer than their lines, or with more entries, is not read through (and is rebuilt).
    const int64_t most_entries = file_size / kRecordOverhead;
    const auto index_size = static_cast<int64_t>(fs::file_size(candidate, error));
    if (error || index_size > (most_entries + 1) * kMaxIndexLineBytes) continue;
    auto entries = read_index_file(candidate, most_entries);
    if (consistent(entries, file_size)) return entries;  // else stale or damaged: rebuild
  }
  ScanResult scan = scan_tfrecord_file(data_path, /*check_payload_crc=*/false);
  bad->insert(bad->end(), scan.bad.begin(), scan.bad.end());
  // An index of a damaged file would not be `consistent`; keep it in memory only.
  if (!scan.bad.empty()) return scan.entries;
  const fs::path parent = fs::path(data_path).parent_path();
  const std::string folder = parent.empty() ? "." : parent.string();
  const bool writable = [&] {
    const StorageCallScope call("looking at", folder);
    return ::access(folder.c_str(), W_OK) == 0;
  }();
  if (writable && write_index_file(beside, scan.entries)) return scan.entries;
  if (!cache_dir.empty()) {
    {
      const StorageCallScope call("making", cache_dir);
      fs::create_directories(cache_dir, error);
    }
    write_index_file(cached, scan.entries);  // best effort: without it we rebuild next time
  }
  return scan.entries;
}

void build_missing_indexes(const std::vector<std::string>& files, const std::string& cache_dir,
                           int share, int shares, int threads) {
  std::atomic<size_t> next{static_cast<size_t>(share)};
  std::mutex mutex;
  std::exception_ptr error;
  auto work = [&] {
    try {
      std::vector<BadRecord> ignored;  // reported when the source loads the index
      for (size_t f; (f = next.fetch_add(shares)) < files.size();)
        load_or_build_index(files[f], cache_dir, &ignored);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex);
      if (!error) error = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < std::max(1, threads); ++t) pool.emplace_back(work);
  for (auto& thread : pool) thread.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace trainer
