// TensorBoard event files: `events.out.tfevents.<time>.<host>.<pid>` in a folder, TFRecord
// framing around Event protobufs (src/report/tensorboard.proto), as TensorFlow's and PyTorch's
// summary writers make them. Scalars, PNG images and text, each with the wall time and the global
// step, so that a resumed run, writing a new file in the same folder, continues the same curves.
// Events are buffered and written by flush(), in one write per flush, so TensorBoard never reads
// half a record.
#pragma once

#include <cstdint>
#include <deque>
#include <string>

namespace trainer {

class TensorBoardWriter {
 public:
  // Creates `folder` and a new event file in it; throws UserError when it cannot.
  explicit TensorBoardWriter(const std::string& folder);
  ~TensorBoardWriter();  // flushes
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  void scalar(const std::string& tag, int64_t step, double value);
  // `png`: an encoded PNG image of `height` x `width` RGB pixels.
  void image(const std::string& tag, int64_t step, const std::string& png, int height, int width);
  // Markdown, shown by TensorBoard's text dashboard.
  void text(const std::string& tag, int64_t step, const std::string& markdown);
  // The run starts, or resumes, at `step`: TensorBoard drops what earlier files hold from there
  // on (a killed run's steps after its last checkpoint), so no step shows twice.
  void session_start(int64_t step);
  // Writes the buffered events to the file (safe from the training thread only; call it at log
  // intervals and on exit). A failed write (a full disk) never stops training: it is logged, a
  // partly written record is cut off so the file stays readable, and the events stay buffered for
  // the next flush (the oldest dropped past kMaxPendingBytes). Returns whether all were written.
  bool flush();

  const std::string& path() const { return path_; }

 private:
  void add(const std::string& event);  // a serialised Event
  void drop_oldest_past_limit();

  std::string path_;
  int fd_ = -1;
  std::deque<std::string> pending_;  // framed records not yet wholly written, oldest first
  size_t front_written_ = 0;         // bytes of pending_.front() already in the file
  size_t pending_bytes_ = 0;         // of pending_, less front_written_
  int64_t file_bytes_ = 0;           // written to the file so far
  bool failing_ = false;             // the last flush failed (logged once until one succeeds)
  int64_t dropped_ = 0;              // events dropped while writes failed
};

// Events kept for a retry while writes fail: a few minutes of scalars, or a few image grids.
constexpr size_t kMaxPendingBytes = 8 << 20;

}  // namespace trainer
