// Index files in DALI's `tfrecord2idx` format (text, one `<offset> <size>` line per record, size
// including the framing), built by scanning a TFRecord file with large sequential reads, cached
// beside the data when that folder is writable and in a cache folder otherwise.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/formats/tfrecord/record.h"

namespace trainer {

struct BadRecord {
  std::string file;
  int64_t offset = 0;
  std::string reason;
};

struct ScanResult {
  std::vector<IndexEntry> entries;  // every intact record, in file order
  std::vector<BadRecord> bad;       // damage found; a broken frame ends the scan (no resync)
};

// Scans a TFRecord file in multi-MB reads. `check_payload_crc` = false checks only the framing
// (lengths and their CRCs), which is all an index needs; the reader checks payloads later.
ScanResult scan_tfrecord_file(const std::string& path, bool check_payload_crc);

// The entries of an index file; UserError when a line is malformed. Reading stops after
// `most_entries` + 1 entries (more than a file of that many minimal records can have).
std::vector<IndexEntry> read_index_file(const std::string& path,
                                        int64_t most_entries = INT64_MAX - 1);
// Writes atomically (a temporary file renamed over the target), so ranks racing to build the
// same index never see a partial one. The temporary file's name starts with a dot, so no data
// glob (`train-*`) or folder listing ever takes it for data. Returns false when the folder is
// not writable.
bool write_index_file(const std::string& path, const std::vector<IndexEntry>& entries);

// The index of `data_path`: `<data_path>.idx` if present and consistent with the file, else one
// in `cache_dir`, else built by scanning and stored beside the data or, failing that, in
// `cache_dir`. Damage found while building is appended to `bad`.
std::vector<IndexEntry> load_or_build_index(const std::string& data_path,
                                            const std::string& cache_dir,
                                            std::vector<BadRecord>* bad);

// Builds the missing indexes of this process's share of `files` (those whose position is `share`
// modulo `shares`: the ranks of a node split the files, so each is scanned once per node), in
// `threads` threads, and stores them as load_or_build_index does. Damage is left for
// load_or_build_index to find and report.
void build_missing_indexes(const std::vector<std::string>& files, const std::string& cache_dir,
                           int share, int shares, int threads);

// Where the cached index of `data_path` lives in `cache_dir` (a name unique to the full path).
std::string cached_index_path(const std::string& data_path, const std::string& cache_dir);

}  // namespace trainer
