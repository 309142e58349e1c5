// TensorBoard's Event records, serialised (src/report/tensorboard.proto): a scalar, a PNG image or
// a markdown text at a global step, stamped with the wall time. Built in a library of their own,
// with the system protobuf (see src/CMakeLists.txt); src/report/tensorboard_writer.h frames and
// writes them.
#pragma once

#include <cstdint>
#include <string>

namespace trainer {

std::string file_version_event();  // the first record of every event file
std::string scalar_event(const std::string& tag, int64_t step, double value);
// `png`: an encoded PNG of `height` x `width` RGB pixels.
std::string image_event(const std::string& tag, int64_t step, const std::string& png, int height,
                        int width);
// SessionLog START: the run starts, or resumes, at `step` (see src/report/tensorboard.proto).
std::string session_start_event(int64_t step);
// Markdown for TensorBoard's text dashboard.
std::string text_event(const std::string& tag, int64_t step, const std::string& markdown);

}  // namespace trainer
