// MPI calls checked. MPI calls return their error (the process group sets MPI_ERRORS_RETURN on
// MPI_COMM_WORLD, so that the error reaches `main`, which logs it with the rank and ends the whole
// job): a failure throws with file:line, the call and MPI's message.
#pragma once

#include <mpi.h>

#include <stdexcept>
#include <string>

#include "base/user_error.h"

#define MPI_CHECK(expr)                                                                        \
  do {                                                                                         \
    const int status_ = (expr);                                                                \
    if (status_ != MPI_SUCCESS) {                                                              \
      char message_[MPI_MAX_ERROR_STRING];                                                     \
      int length_ = 0;                                                                         \
      if (MPI_Error_string(status_, message_, &length_) != MPI_SUCCESS) length_ = 0;           \
      throw std::runtime_error(::trainer::detail::concat(                                      \
          __FILE__, ":", __LINE__, ": ", #expr, " failed: ", std::string(message_, length_))); \
    }                                                                                          \
  } while (0)
