#include "src/tensorboard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "data/tfrecord/record.h"
#include "src/check.h"
#include "src/tensorboard_events.h"

namespace trainer {
namespace {

// events.out.tfevents.<unix seconds>.<host>.<pid>: the name TensorBoard looks for, unique per
// process, so a resumed run adds a file beside the earlier ones.
std::string file_name() {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  return "events.out.tfevents." + std::to_string(seconds) + "." + host + "." +
         std::to_string(::getpid());
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& folder) {
  std::error_code error;
  std::filesystem::create_directories(folder, error);
  path_ = (std::filesystem::path(folder) / file_name()).string();
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  USER_CHECK(fd_ >= 0, "cannot write TensorBoard events to ", path_, ": ", std::strerror(errno),
             ". Fix: make output_dir writable, or set tensorboard = false");
  add(file_version_event());
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  try {
    flush();
  } catch (const std::exception&) {  // a destructor cannot report it
  }
  ::close(fd_);
}

void TensorBoardWriter::add(const std::string& event) { pending_ += frame_record(event); }

void TensorBoardWriter::scalar(const std::string& tag, int64_t step, double value) {
  add(scalar_event(tag, step, value));
}

void TensorBoardWriter::image(const std::string& tag, int64_t step, const std::string& png,
                              int height, int width) {
  add(image_event(tag, step, png, height, width));
}

void TensorBoardWriter::text(const std::string& tag, int64_t step, const std::string& markdown) {
  add(text_event(tag, step, markdown));
}

void TensorBoardWriter::flush() {
  size_t done = 0;
  while (done < pending_.size()) {
    const ssize_t n = ::write(fd_, pending_.data() + done, pending_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    USER_CHECK(n >= 0, "writing TensorBoard events to ", path_, " failed: ", std::strerror(errno),
               " (disk full?). Fix: free space on the output volume, or set tensorboard = false");
    done += static_cast<size_t>(n);
  }
  pending_.clear();
}

}  // namespace trainer
