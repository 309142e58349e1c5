// A debugging record of what each rank trained: one line per step, `<epoch> <step> <id> <id> ...`
// with the sample ids (TFRecord record or generated image index) of the rank's batch, as the batch
// source delivered them. Appended to, so a resumed run continues the same file. Turned on by the
// environment variable TRAINER_SAMPLE_TRACE (a folder; src/environment.h): it answers "did every
// image get trained once this epoch?" across resizes and restarts, without trusting a counter.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdio>
#include <string>

namespace trainer {

class SampleTrace {
 public:
  // Appends to `<folder>/rank-<rank>.txt`, creating the folder.
  SampleTrace(const std::string& folder, int rank);
  ~SampleTrace();
  SampleTrace(const SampleTrace&) = delete;
  SampleTrace& operator=(const SampleTrace&) = delete;

  // `ids`: (N) int64 on the CPU; undefined (synthetic data) writes the line without ids.
  void write(int64_t epoch, int64_t step, const at::Tensor& ids);

 private:
  std::FILE* file_ = nullptr;
};

}  // namespace trainer
