// An error the user can fix (see STYLE.md): bad configuration, input or environment, with a
// message that names the offending value, where it came from and the fix. Thrown with USER_CHECK.
// Apart from check.h's library checks, so that code reading files (data/formats) needs neither
// CUDA, NCCL nor MPI to build.
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
