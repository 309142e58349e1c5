// TensorBoard event files: `events.out.tfevents.<time>.<host>.<pid>` in a folder, TFRecord
// framing around Event protobufs (src/tensorboard.proto), as TensorFlow's and PyTorch's summary
// writers make them. Scalars, PNG images and text, each with the wall time and the global step, so
// that a resumed run, writing a new file in the same folder, continues the same curves. Events
// are buffered and written by flush(), in one write per flush, so TensorBoard never reads half a
// record.
#pragma once

#include <cstdint>
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
  // Writes the buffered events to the file and hands them to the kernel (safe from the
  // training thread only; call it at log intervals and on exit).
  void flush();

  const std::string& path() const { return path_; }

 private:
  void add(const std::string& event);  // a serialised Event

  std::string path_;
  int fd_ = -1;
  std::string pending_;  // framed records not yet written
};

}  // namespace trainer
