#include "data/formats/tfrecord/verify.h"

#include <atomic>
#include <fstream>
#include <mutex>
#include <opencv2/core.hpp>
#include <sstream>
#include <thread>

#include "base/user_error.h"
#include "data/formats/jpeg/decode.h"
#include "data/formats/tfrecord/file.h"
#include "data/formats/tfrecord/image_example.h"
#include "data/formats/tfrecord/index.h"
#include "data/formats/tfrecord/record_layout.h"

namespace trainer {

uint64_t fnv1a64(const std::string& bytes) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

namespace {

struct FileResult {
  int64_t records = 0;
  std::vector<std::string> problems;
  std::map<int64_t, int64_t> per_class;
  std::string dump;
};

// Dump line: file, record index, stored label, height, width, filename, encoded size, FNV-1a.
FileResult verify_file(const std::string& path, const VerifyOptions& o) {
  FileResult r;
  ScanResult scan = scan_tfrecord_file(path, /*check_payload_crc=*/true);
  for (const auto& b : scan.bad)
    r.problems.push_back(path + " at byte " + std::to_string(b.offset) + ": " + b.reason);
  ReadFile file(path);
  std::vector<uint8_t> buffer;
  ImageExample example;
  std::string error;
  std::ostringstream dump;
  for (size_t i = 0; i < scan.entries.size(); ++i) {
    const IndexEntry& e = scan.entries[i];
    buffer.resize(static_cast<size_t>(e.size));
    file.read_at(e.offset, buffer.data(), e.size);
    std::string_view payload;
    int64_t size = 0;
    const std::string where = path + " at byte " + std::to_string(e.offset) + ": ";
    const RecordStatus status = parse_record(buffer.data(), e.size, &payload, &size);
    bool intact = status == RecordStatus::kOk;
    if (!intact) {
      error = to_string(status);
    } else if (!parse_image_example(payload, &example, &error, o.layout)) {
      intact = false;  // named with the layout: another layout's record lacks this one's features
      error += std::string(" (record layout ") + layout_name(o.layout) + ")";
    }
    if (!intact) {
      r.problems.push_back(where + error);
      continue;
    }
    ++r.records;
    ++r.per_class[example.label];
    if (example.label < o.label_offset || example.label >= o.label_offset + o.num_classes)
      r.problems.push_back(where + "label " + std::to_string(example.label) + " outside [" +
                           std::to_string(o.label_offset) + ", " +
                           std::to_string(o.label_offset + o.num_classes) + ")");
    cv::Mat rgb;
    if (o.decode && !decode_full(example.encoded, &rgb, &error)) {
      r.problems.push_back(where + error);
    } else if (o.decode && example.height > 0 &&
               (rgb.rows != example.height || rgb.cols != example.width)) {
      r.problems.push_back(where + "image is " + std::to_string(rgb.cols) + "x" +
                           std::to_string(rgb.rows) + ", features say " +
                           std::to_string(example.width) + "x" + std::to_string(example.height));
    }
    if (!o.dump_path.empty())
      dump << path << '\t' << i << '\t' << example.label << '\t' << example.height << '\t'
           << example.width << '\t' << example.filename << '\t' << example.encoded.size() << '\t'
           << std::hex << fnv1a64(example.encoded) << std::dec << '\n';
  }
  r.dump = dump.str();
  return r;
}

}  // namespace

VerifyReport verify_tfrecord_files(const std::vector<std::string>& files,
                                   const VerifyOptions& options) {
  VerifyOptions o = options;  // the layout and label base made concrete, as the trainer does
  o.layout = resolve_record_layout(o.layout, files, "--record-layout");
  if (o.label_offset < 0) o.label_offset = default_label_offset(o.layout);
  std::vector<FileResult> results(files.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t f = next++; f < files.size(); f = next++) {
      try {
        results[f] = verify_file(files[f], o);
      } catch (const std::exception& e) {
        results[f].problems.push_back(files[f] + ": " + e.what());
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < std::max(1, o.threads); ++t) threads.emplace_back(work);
  for (auto& t : threads) t.join();
  VerifyReport report;
  report.layout = o.layout;
  report.label_offset = o.label_offset;
  std::ofstream dump;
  if (!o.dump_path.empty()) {
    dump.open(o.dump_path);
    USER_CHECK(dump, "cannot write '", o.dump_path, "'");
  }
  for (auto& r : results) {
    ++report.files;
    report.records += r.records;
    report.problems.insert(report.problems.end(), r.problems.begin(), r.problems.end());
    for (auto [label, count] : r.per_class) report.per_class[label] += count;
    if (dump.is_open()) dump << r.dump;
  }
  return report;
}

std::string format_report(const VerifyReport& report) {
  std::ostringstream out;
  out << report.files << " files, " << report.records << " intact records, "
      << report.per_class.size() << " classes, " << report.problems.size() << " problems\n";
  out << "record layout " << layout_name(report.layout) << ", stored labels from "
      << report.label_offset << "\n";
  int64_t lo = -1, hi = -1;
  for (auto [label, count] : report.per_class) {
    lo = lo < 0 ? count : std::min(lo, count);
    hi = std::max(hi, count);
  }
  if (!report.per_class.empty()) out << "records per class: min " << lo << ", max " << hi << "\n";
  for (auto [label, count] : report.per_class) out << "  label " << label << ": " << count << "\n";
  for (const auto& p : report.problems) out << "PROBLEM " << p << "\n";
  return out.str();
}

}  // namespace trainer
