// Error handling: the three kinds of failure (see STYLE.md).
// - UserError: bad configuration, input or environment; the message names the offending value,
//   where it came from and the fix. Thrown with USER_CHECK (base/user_error.h).
// - CUDA_CHECK / NCCL_CHECK / MPI_CHECK: library calls, reporting file:line and the library's own
// message.
// - Internal invariants use TORCH_INTERNAL_ASSERT (a bug in this project, not the user's input).
#pragma once

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <stdexcept>
#include <string>

#include "base/user_error.h"

#define CUDA_CHECK(expr)                                                                    \
  do {                                                                                      \
    cudaError_t status_ = (expr);                                                           \
    if (status_ != cudaSuccess)                                                             \
      throw std::runtime_error(::trainer::detail::concat(                                   \
          __FILE__, ":", __LINE__, ": ", #expr, " failed: ", cudaGetErrorString(status_))); \
  } while (0)

#define NCCL_CHECK(expr)                                                                           \
  do {                                                                                             \
    ncclResult_t status_ = (expr);                                                                 \
    if (status_ != ncclSuccess)                                                                    \
      throw std::runtime_error(::trainer::detail::concat(__FILE__, ":", __LINE__, ": ", #expr,     \
                                                         " failed: ", ncclGetErrorString(status_), \
                                                         " (", ncclGetLastError(nullptr), ")"));   \
  } while (0)

// MPI calls return their error (the process group sets MPI_ERRORS_RETURN on MPI_COMM_WORLD, so
// that the error reaches `main`, which logs it with the rank and ends the whole job).
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
