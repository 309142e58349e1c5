#include "src/report/sample_trace.h"

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "base/user_error.h"

namespace trainer {

SampleTrace::SampleTrace(const std::string& folder, int rank) {
  std::error_code error;
  std::filesystem::create_directories(folder, error);
  const std::string path = folder + "/rank-" + std::to_string(rank) + ".txt";
  file_ = std::fopen(path.c_str(), "a");
  USER_CHECK(file_, "cannot write the sample trace ", path, ": ", std::strerror(errno),
             ". Fix: point TRAINER_SAMPLE_TRACE at a writable folder, or unset it");
}

SampleTrace::~SampleTrace() { std::fclose(file_); }

void SampleTrace::write(int64_t epoch, int64_t step, const at::Tensor& ids) {
  std::fprintf(file_, "%lld %lld", static_cast<long long>(epoch), static_cast<long long>(step));
  if (ids.defined()) {
    const at::Tensor contiguous = ids.contiguous();
    const int64_t* id = contiguous.data_ptr<int64_t>();
    for (int64_t i = 0; i < contiguous.numel(); ++i)
      std::fprintf(file_, " %lld", static_cast<long long>(id[i]));
  }
  std::fputc('\n', file_);
  std::fflush(file_);  // a killed rank's trace still holds every step it finished
}

}  // namespace trainer
