// TFRecord framing: uint64 length (LE), masked CRC32C of the length, payload, masked CRC32C of
// the payload. Parsing from memory (the reader hands it large buffers) and writing, with the
// DALI-style index entry (offset, size including the 16 framing bytes) of each record written.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace trainer {

constexpr int64_t kRecordOverhead = 16;  // 8 length + 4 length CRC + 4 payload CRC bytes

enum class RecordStatus { kOk, kTruncated, kBadLengthCrc, kBadDataCrc, kSizeMismatch };
const char* to_string(RecordStatus status);

// Parses the record starting at `data`, of which `available` bytes are in memory. On kOk,
// `payload` views the payload and `record_size` is its framed size.
RecordStatus parse_record(const uint8_t* data, int64_t available, std::string_view* payload,
                          int64_t* record_size);

// The framed bytes of one record.
std::string frame_record(std::string_view payload);

struct IndexEntry {
  int64_t offset = 0;  // byte offset of the record's length field in its file
  int64_t size = 0;    // framed size: payload + kRecordOverhead
  bool operator==(const IndexEntry& o) const { return offset == o.offset && size == o.size; }
};

// Writes records to a file and remembers their index entries. Throws UserError on I/O errors.
class RecordWriter {
 public:
  explicit RecordWriter(const std::string& path);
  ~RecordWriter();
  RecordWriter(const RecordWriter&) = delete;
  RecordWriter& operator=(const RecordWriter&) = delete;
  void write(std::string_view payload);
  void close();  // flushes; also done by the destructor (which cannot report errors)
  const std::vector<IndexEntry>& index() const { return index_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  int64_t offset_ = 0;
  std::vector<IndexEntry> index_;
};

}  // namespace trainer
