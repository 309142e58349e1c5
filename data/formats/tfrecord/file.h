// Files for the TFRecord reader: an RAII read-only descriptor with positional reads that never
// move a shared offset (so reader threads share nothing), and file listing from a glob or folder.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainer {

class ReadFile {
 public:
  explicit ReadFile(const std::string& path);  // throws UserError naming the path and errno
  ~ReadFile();
  ReadFile(const ReadFile&) = delete;
  ReadFile& operator=(const ReadFile&) = delete;

  int64_t size() const { return size_; }
  // Reads up to `size` bytes at `offset` (looping over short reads); returns the bytes read,
  // fewer only at the end of the file.
  int64_t read_at(int64_t offset, void* out, int64_t size) const;
  // Tells the kernel (and Lustre's client) that [offset, offset + size) is read next, in order.
  void advise_sequential(int64_t offset, int64_t size) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// The TFRecord files a config key names: a directory (every regular file in it except index
// files and `.txt` class names files) or a glob (`/fsx/imagenet/train-*`). Sorted by name. A
// missing or empty directory or a glob matching nothing is a UserError naming `key` and the value.
std::vector<std::string> list_tfrecord_files(const std::string& pattern, const std::string& key);

}  // namespace trainer
