#include "src/report/tensorboard_writer.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "base/user_error.h"
#include "data/formats/tfrecord/record.h"
#include "src/report/tensorboard_events.h"

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
  // A record cut short by a failed last write would make the reader report the file damaged.
  if (!flush() && front_written_ > 0 && ::ftruncate(fd_, file_bytes_ - front_written_) != 0)
    spdlog::warn("{} ends in a record cut short: TensorBoard reads the file up to it", path_);
  ::close(fd_);
}

void TensorBoardWriter::add(const std::string& event) {
  pending_.push_back(frame_record(event));
  pending_bytes_ += pending_.back().size();
}

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

void TensorBoardWriter::session_start(int64_t step) { add(session_start_event(step)); }

bool TensorBoardWriter::flush() {
  if (pending_.empty()) return true;
  // One write: a reader sees no record half written that could have been whole.
  std::string bytes;
  bytes.reserve(pending_bytes_);
  bytes.append(pending_.front(), front_written_, std::string::npos);
  for (size_t i = 1; i < pending_.size(); ++i) bytes += pending_[i];
  size_t done = 0;
  int error = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      error = errno;
      break;
    }
    done += static_cast<size_t>(n);
  }
  // What reached the file leaves the queue; a record written in part stays at the front, and the
  // next flush writes the rest of it, never its start again.
  file_bytes_ += static_cast<int64_t>(done);
  pending_bytes_ -= done;
  for (size_t left = done; left > 0;) {
    const size_t rest = pending_.front().size() - front_written_;
    const size_t take = std::min(left, rest);
    front_written_ += take;
    left -= take;
    if (front_written_ == pending_.front().size()) {
      pending_.pop_front();
      front_written_ = 0;
    }
  }
  if (error == 0) {
    if (failing_)
      spdlog::info("TensorBoard events are written to {} again ({} dropped meanwhile)", path_,
                   dropped_);
    failing_ = false;
    return true;
  }
  if (!failing_)
    spdlog::warn(
        "cannot write TensorBoard events to {}: {} (disk full?). Training goes on; the events "
        "are kept and written once there is space. Fix: free space on the output volume",
        path_, std::strerror(error));
  failing_ = true;
  drop_oldest_past_limit();
  return false;
}

// Whole records only, and never one already begun in the file.
void TensorBoardWriter::drop_oldest_past_limit() {
  const size_t first = front_written_ > 0 ? 1 : 0;
  while (pending_bytes_ > kMaxPendingBytes && pending_.size() > first) {
    pending_bytes_ -= pending_[first].size();
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(first));
    ++dropped_;
  }
}

}  // namespace trainer
