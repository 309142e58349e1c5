// An error the user can fix: bad configuration, input or environment, with a message that names
// the offending value, where it came from and the fix. Thrown with USER_CHECK. The library checks
// live apart (cuda_check.h, cudnn_check.h, nccl_check.h, mpi_check.h beside this file), so that
// code reading files (data/formats) builds without CUDA, NCCL or MPI.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace trainer {

// An error the user can fix: the message says what, where and how.
class UserError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
}  // namespace detail

}  // namespace trainer

// Throws trainer::UserError with the streamed message parts when `cond` is false.
#define USER_CHECK(cond, ...)                                                        \
  do {                                                                               \
    if (!(cond)) throw ::trainer::UserError(::trainer::detail::concat(__VA_ARGS__)); \
  } while (0)
