// Dataset verification for the verify-tfrecords tool and the tests: every record's framing and
// CRCs, its Example, its image (decoded in full, size checked against image/height|width) and
// its label range, with per-class counts; optionally a dump of each record for comparisons.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "data/formats/tfrecord/image_example.h"

namespace trainer {

struct VerifyOptions {
  int64_t num_classes = 1000;
  // Which features hold the image and label; kAuto: the first record's (resolve_record_layout,
  // as the trainer decides).
  RecordLayout layout = RecordLayout::kAuto;
  // Stored labels must lie in [label_offset, label_offset + classes); -1: the layout's
  // (default_label_offset).
  int64_t label_offset = -1;
  bool decode = true;  // decode every image (slow but thorough)
  int threads = 1;
  std::string dump_path;  // if set: one TSV line per record (see verify.cpp)
};

struct VerifyReport {
  int64_t files = 0;
  int64_t records = 0;                        // intact records
  std::vector<std::string> problems;          // "file at byte N: reason"
  std::map<int64_t, int64_t> per_class;       // stored label -> records
  RecordLayout layout = RecordLayout::kAuto;  // the layout read (resolved)
  int64_t label_offset = 0;                   // the lowest valid stored label (resolved)
  bool ok() const { return problems.empty(); }
};

// UserError when options.layout is kAuto and the first record is of neither layout.
VerifyReport verify_tfrecord_files(const std::vector<std::string>& files,
                                   const VerifyOptions& options);

std::string format_report(const VerifyReport& report);

// FNV-1a 64 of bytes: a stable fingerprint for the dump (the tests recompute it in Python).
uint64_t fnv1a64(const std::string& bytes);

}  // namespace trainer
