#include "data/formats/tfrecord/file.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "base/storage_calls.h"
#include "base/user_error.h"

namespace trainer {

ReadFile::ReadFile(const std::string& path) : path_(path) {
  const StorageCallScope call("opening", path);
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  USER_CHECK(fd_ >= 0, "cannot open TFRecord file '", path, "': ", std::strerror(errno),
             ". Fix: check the path and its permissions");
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int error = errno;
    ::close(fd_);
    throw UserError(detail::concat("cannot stat '", path, "': ", std::strerror(error)));
  }
  size_ = st.st_size;
}

ReadFile::~ReadFile() {
  if (fd_ >= 0) ::close(fd_);
}

int64_t ReadFile::read_at(int64_t offset, void* out, int64_t size) const {
  auto* dst = static_cast<char*>(out);
  int64_t done = 0;
  const StorageCallScope call("reading", path_, offset);
  while (done < size) {
    const ssize_t n = ::pread(fd_, dst + done, static_cast<size_t>(size - done), offset + done);
    if (n < 0 && errno == EINTR) continue;
    USER_CHECK(n >= 0, "read of '", path_, "' at byte ", offset + done,
               " failed: ", std::strerror(errno));
    if (n == 0) break;  // end of file
    done += n;
  }
  return done;
}

void ReadFile::advise_sequential(int64_t offset, int64_t size) const {
  // Advice only: a file system that ignores it still reads correctly.
  ::posix_fadvise(fd_, offset, size, POSIX_FADV_SEQUENTIAL);
  ::posix_fadvise(fd_, offset, size, POSIX_FADV_WILLNEED);
}

namespace {

// Files that lie beside the records and are not records: index files (`.idx`) and class names
// files (`synsets.txt`, TFDS's `label.labels.txt`; data/datasets/class_names.h).
bool is_beside_records(const std::string& path) {
  auto ends_with = [&](const char* suffix) {
    const size_t n = std::char_traits<char>::length(suffix);
    return path.size() > n && path.compare(path.size() - n, n, suffix) == 0;
  };
  return ends_with(".idx") || ends_with(".txt");
}

}  // namespace

std::vector<std::string> list_tfrecord_files(const std::string& pattern, const std::string& key) {
  namespace fs = std::filesystem;
  USER_CHECK(!pattern.empty(), "config key '", key, "' is empty; set it to a directory of ",
             "TFRecord files or a glob such as /fsx/imagenet/train-*");
  std::vector<std::string> files;
  std::error_code error;
  const StorageCallScope call("listing", pattern);
  if (fs::is_directory(pattern, error)) {
    for (const auto& entry : fs::directory_iterator(pattern, error))
      if (entry.is_regular_file() && !is_beside_records(entry.path().string()) &&
          entry.path().filename().string()[0] != '.')
        files.push_back(entry.path().string());
    USER_CHECK(!files.empty(), "config key '", key, "' = '", pattern,
               "' is an empty directory; it must hold TFRecord files (train-00000-of-01024 ...)");
  } else {
    glob_t matches{};
    const int status = ::glob(pattern.c_str(), 0, nullptr, &matches);
    for (size_t i = 0; status == 0 && i < matches.gl_pathc; ++i)
      if (!is_beside_records(matches.gl_pathv[i]) &&
          fs::is_regular_file(matches.gl_pathv[i], error))
        files.emplace_back(matches.gl_pathv[i]);
    ::globfree(&matches);
    USER_CHECK(!files.empty(), "config key '", key, "' = '", pattern,
               "' matches no TFRecord file (not a directory, and the glob matches nothing). ",
               "Fix: point it at the data, e.g. /fsx/imagenet/train-* or the folder holding it");
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace trainer
